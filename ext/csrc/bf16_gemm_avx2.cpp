// AVX2 + FMA BF16-weight kernel (the lm_head on CPUs without AVX-512). Compiled for that
// ISA only. bf16 -> fp32 is exact (the bits shifted into the high half), so the product is
// the shared column-tile GEMM of avx2_gemm.inc with fp32 weights: batch-invariant, one
// summation order per output that depends on K alone.
#include <immintrin.h>

#include "isa.h"

ISA_BEGIN("avx2,fma,f16c")

namespace fp8serve {
namespace avx2 {
namespace {

struct Bf16Loader {  // 16 bf16 -> fp32 (columns 0..7 in lo, 8..15 in hi)
  using Elem = uint16_t;
  static inline void load(const uint16_t* p, __m256& lo, __m256& hi) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    lo = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(raw)), 16));
    hi = _mm256_castsi256_ps(
        _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(raw, 1)), 16));
  }
};

#include "avx2_gemm.inc"

inline uint16_t to_bf16_rne(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// y rows r0 .. r0 + rows - 1 of tile t: acc + bias, fp32 or rounded to bf16.
inline void store_rows(const __m256 acc[kMaxRows][2], int64_t r0, int64_t rows, int64_t n,
                       const float* bias, void* y, bool y_fp32, int64_t t) {
  const int64_t n0 = t * kTileN2;
  const int64_t cols = n - n0 < kTileN2 ? n - n0 : kTileN2;
  alignas(32) float out[2][8];
  for (int64_t r = 0; r < rows; ++r) {
    _mm256_store_ps(out[0], acc[r][0]);
    _mm256_store_ps(out[1], acc[r][1]);
    const int64_t row = (r0 + r) * n + n0;
    for (int64_t j = 0; j < cols; ++j) {
      const float v = bias ? out[j / 8][j % 8] + bias[n0 + j] : out[j / 8][j % 8];
      if (y_fp32) {
        static_cast<float*>(y)[row + j] = v;
      } else {
        static_cast<uint16_t*>(y)[row + j] = to_bf16_rne(v);
      }
    }
  }
}

}  // namespace

void bf16_gemm_tiles(const float* x, int64_t m, int64_t k, const uint16_t* w, int64_t n,
                     const float* bias, void* y, bool y_fp32, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    tile_all_rows<Bf16Loader>(x, m, k, w + t * k * kTileN2,
                              [&](int64_t r0, int64_t rows, const __m256 acc[kMaxRows][2]) {
                                store_rows(acc, r0, rows, n, bias, y, y_fp32, t);
                              });
  }
}

}  // namespace avx2
}  // namespace fp8serve

ISA_END
