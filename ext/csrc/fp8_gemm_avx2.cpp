// AVX2 + FMA + F16C FP8 kernels for CPUs without AVX-512. Compiled for that ISA only.
//
// FP8 e4m3 -> FP32 (16 codes per step): s = sign-extend(code) to 16 bits;
// h = (s << 7) & 0xBF80 is the fp16 encoding of value * 2^-8 for every code (normals keep
// their exponent field e, which fp16 reads with bias 15; exponent-0 codes become fp16
// subnormals m * 2^-17, which vcvtph2ps converts exactly). 256 is folded into the scale.
#include <immintrin.h>

#include "isa.h"

ISA_BEGIN("avx2,fma,f16c")

namespace fp8serve {
namespace avx2 {
namespace {

constexpr float kUnscale = 256.0f;

inline void cvt16(__m128i raw, __m256& lo, __m256& hi) {
  const __m256i s = _mm256_cvtepi8_epi16(raw);
  const __m256i h =
      _mm256_and_si256(_mm256_slli_epi16(s, 7), _mm256_set1_epi16(static_cast<short>(0xBF80)));
  lo = _mm256_cvtph_ps(_mm256_castsi256_si128(h));
  hi = _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1));
}

inline uint16_t to_bf16_rne(float f) {
  uint32_t u;
  __builtin_memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// acc[r][h] = sum_k x[m0 + r, k] * w(tile t)[k, 8h .. 8h+7]; U accumulator sets (set u
// sums the k with k % U == u in order, the sets are added 0 + 1 + ... at the end, the
// tail k past the last multiple of U goes to set 0).
template <int R, int U>
inline void accumulate(const float* x, int64_t k, const uint8_t* w, __m256 acc[R][2]) {
  __m256 c[U][R][2];
  for (int u = 0; u < U; ++u)
    for (int r = 0; r < R; ++r) c[u][r][0] = c[u][r][1] = _mm256_setzero_ps();
  int64_t kk = 0;
  for (; kk + U <= k; kk += U) {
    for (int u = 0; u < U; ++u) {
      __m256 lo, hi;
      cvt16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16 * (kk + u))), lo, hi);
      for (int r = 0; r < R; ++r) {
        const __m256 xb = _mm256_broadcast_ss(x + r * k + kk + u);
        c[u][r][0] = _mm256_fmadd_ps(lo, xb, c[u][r][0]);
        c[u][r][1] = _mm256_fmadd_ps(hi, xb, c[u][r][1]);
      }
    }
  }
  for (; kk < k; ++kk) {
    __m256 lo, hi;
    cvt16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w + 16 * kk)), lo, hi);
    for (int r = 0; r < R; ++r) {
      const __m256 xb = _mm256_broadcast_ss(x + r * k + kk);
      c[0][r][0] = _mm256_fmadd_ps(lo, xb, c[0][r][0]);
      c[0][r][1] = _mm256_fmadd_ps(hi, xb, c[0][r][1]);
    }
  }
  for (int r = 0; r < R; ++r) {
    acc[r][0] = c[0][r][0];
    acc[r][1] = c[0][r][1];
    for (int u = 1; u < U; ++u) {
      acc[r][0] = _mm256_add_ps(acc[r][0], c[u][r][0]);
      acc[r][1] = _mm256_add_ps(acc[r][1], c[u][r][1]);
    }
  }
}

// Batch invariance: every row of every group size uses the same U, so an output's
// summation order depends on k alone, never on M or on which rows share its group (the
// same row gives the same bits alone, batched or in any prefill chunk). U = 2 with groups
// of at most 3 rows keeps the 2 * U * R accumulators and the operands in 16 registers.
constexpr int kSets = 2;
constexpr int kMaxRows = 3;

template <int R>
void tile_rows(const float* x, int64_t m0, int64_t k, const uint8_t* w, int64_t n,
               const float* scale, const float* bias, uint16_t* y, int64_t t) {
  constexpr int U = kSets;
  __m256 acc[R][2];
  accumulate<R, U>(x + m0 * k, k, w + t * k * kTileN2, acc);
  const int64_t n0 = t * kTileN2;
  const int64_t cols = n - n0 < kTileN2 ? n - n0 : kTileN2;
  alignas(32) float out[2][8];
  for (int r = 0; r < R; ++r) {
    _mm256_store_ps(out[0], acc[r][0]);
    _mm256_store_ps(out[1], acc[r][1]);
    uint16_t* yr = y + (m0 + r) * n + n0;
    for (int64_t j = 0; j < cols; ++j) {
      const float v = out[j / 8][j % 8] * (scale[n0 + j] * kUnscale);
      yr[j] = to_bf16_rne(bias ? v + bias[n0 + j] : v);
    }
  }
}

}  // namespace

void fp8_to_bf16(const uint8_t* src, uint16_t* dst, int64_t n) {
  const __m256 unscale = _mm256_set1_ps(kUnscale);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 lo, hi;
    cvt16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i)), lo, hi);
    // values are exact in bf16, so dropping the low half is exact
    const __m256i a = _mm256_srli_epi32(_mm256_castps_si256(_mm256_mul_ps(lo, unscale)), 16);
    const __m256i b = _mm256_srli_epi32(_mm256_castps_si256(_mm256_mul_ps(hi, unscale)), 16);
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(a, b), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + i), packed);
  }
  for (; i < n; ++i) dst[i] = fp8_to_bf16_scalar(src[i]);
}

void gemm_tiles(const float* x, int64_t m, int64_t k, const uint8_t* w, int64_t n,
                const float* scale, const float* bias, uint16_t* y, int64_t t0, int64_t t1) {
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t m0 = 0; m0 < m; m0 += kMaxRows) {
      switch (m - m0 >= kMaxRows ? kMaxRows : m - m0) {
        case 1: tile_rows<1>(x, m0, k, w, n, scale, bias, y, t); break;
        case 2: tile_rows<2>(x, m0, k, w, n, scale, bias, y, t); break;
        default: tile_rows<3>(x, m0, k, w, n, scale, bias, y, t); break;
      }
    }
  }
}

}  // namespace avx2
}  // namespace fp8serve

ISA_END
