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

}  // namespace

void bf16_gemm_tiles(const float* x, int64_t m, int64_t k, const uint16_t* w, int64_t n,
                     const float* bias, void* y, bool y_fp32, int64_t t0, int64_t t1) {
  run_tiles<Bf16Loader>(x, m, k, w, n, nullptr, 1.0f, bias, y, y_fp32, t0, t1);
}

}  // namespace avx2
}  // namespace fp8serve

ISA_END
