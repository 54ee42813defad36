// AVX2 + FMA + F16C FP8 kernels for CPUs without AVX-512. Compiled for that ISA only.
//
// FP8 e4m3 -> FP32 (16 codes per step): h = (sign-extend(code) << 7) & 0xBF80 is the
// fp16 encoding of value * 2^-8 for every code (normals keep their exponent field e, which
// fp16 reads with bias 15; exponent-0 codes become fp16 subnormals m * 2^-17, which
// vcvtph2ps converts exactly). 256 is folded into the scale.
#include <immintrin.h>

#include "isa.h"

ISA_BEGIN("avx2,fma,f16c")

namespace fp8serve {
namespace avx2 {
namespace {

constexpr float kUnscale = 256.0f;

// Per 16-bit lane: unpacking under zero gives code << 8; an arithmetic shift right by one
// puts the sign at bits 15 and 14 and the exponent and mantissa at bits 7..13, and the mask
// clears bit 14. Equal to sign-extend(code) << 7 & 0xBF80, in 128-bit halves (no lane
// extract).
inline void cvt16(__m128i raw, __m256& lo, __m256& hi) {
  const __m128i zero = _mm_setzero_si128();
  const __m128i mask = _mm_set1_epi16(static_cast<short>(0xBF80));
  lo = _mm256_cvtph_ps(_mm_and_si128(_mm_srai_epi16(_mm_unpacklo_epi8(zero, raw), 1), mask));
  hi = _mm256_cvtph_ps(_mm_and_si128(_mm_srai_epi16(_mm_unpackhi_epi8(zero, raw), 1), mask));
}

struct Fp8Loader {  // e4m3 codes -> fp32 values * 2^-8 (cvt16)
  using Elem = uint8_t;
  static inline void load(const uint8_t* p, __m256& lo, __m256& hi) {
    cvt16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)), lo, hi);
  }
};

// e4m3 codes -> fp32 values * 2^-120, for x prescaled by 2^112 (the products are those of
// Fp8Loader's values times x). Each code goes to the top byte of a dword (vpshufb); an
// arithmetic shift right by 4 puts its exponent at fp32 bits 23..26 and its mantissa at
// 20..22, the sign at 31 (and copies at 27..30, which the mask clears). Normal codes become
// normal fp32 numbers (exponent field e, bias 127 = e4m3's 7 + 120); exponent-0 codes
// become fp32 denormals m * 2^-129 = value * 2^-120, exact, and zero stays zero. Denormal
// operands are slower on some CPUs, but such codes are rare in FP8 checkpoints (about 2e-4
// of the weights of the models measured).
struct Fp8TopLoader {
  using Elem = uint8_t;
  static inline void load(const uint8_t* p, __m256& lo, __m256& hi) {
    const __m256i raw =
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    const __m256i to_lo = _mm256_setr_epi8(-1, -1, -1, 0, -1, -1, -1, 1, -1, -1, -1, 2, -1, -1,
                                           -1, 3, -1, -1, -1, 4, -1, -1, -1, 5, -1, -1, -1, 6,
                                           -1, -1, -1, 7);
    const __m256i to_hi = _mm256_setr_epi8(-1, -1, -1, 8, -1, -1, -1, 9, -1, -1, -1, 10, -1,
                                           -1, -1, 11, -1, -1, -1, 12, -1, -1, -1, 13, -1, -1,
                                           -1, 14, -1, -1, -1, 15);
    const __m256i mask = _mm256_set1_epi32(static_cast<int>(0x87F00000u));
    lo = _mm256_castsi256_ps(
        _mm256_and_si256(_mm256_srai_epi32(_mm256_shuffle_epi8(raw, to_lo), 4), mask));
    hi = _mm256_castsi256_ps(
        _mm256_and_si256(_mm256_srai_epi32(_mm256_shuffle_epi8(raw, to_hi), 4), mask));
  }
};

#include "avx2_gemm.inc"

// out = x with k-block b times s[b] (x, out [rows, k])
void scale_x_blocks(const float* x, int64_t rows, int64_t k, const float* s, int64_t bk,
                    float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t k0 = 0, b = 0; k0 < k; k0 += bk, ++b) {
      const int64_t k1 = k - k0 < bk ? k : k0 + bk;
      const __m256 sb = _mm256_set1_ps(s[b]);
      int64_t i = k0;
      for (; i + 8 <= k1; i += 8) {
        _mm256_storeu_ps(out + r * k + i, _mm256_mul_ps(_mm256_loadu_ps(x + r * k + i), sb));
      }
      for (; i < k1; ++i) out[r * k + i] = x[r * k + i] * s[b];
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
                const float* scale, const float* bias, uint16_t* y, int64_t t0, int64_t t1,
                bool x_prescaled) {
  if (x_prescaled) {
    run_tiles<Fp8TopLoader>(x, m, k, w, n, scale, kUnscale, bias, y, false, t0, t1);
  } else {
    run_tiles<Fp8Loader>(x, m, k, w, n, scale, kUnscale, bias, y, false, t0, t1);
  }
}

bool prescale_x(float* x, int64_t count) {
  const __m256 limit = _mm256_set1_ps(65536.0f);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF));
  __m256 ok = _mm256_castsi256_ps(_mm256_set1_epi32(-1));
  int64_t i = 0;
  for (; i + 8 <= count; i += 8) {  // |x| < 2^16, false for NaN (ordered compare)
    const __m256 a = _mm256_and_ps(_mm256_loadu_ps(x + i), abs_mask);
    ok = _mm256_and_ps(ok, _mm256_cmp_ps(a, limit, _CMP_LT_OQ));
  }
  bool fits = _mm256_movemask_ps(ok) == 0xFF;
  for (; i < count; ++i) fits = fits && __builtin_fabsf(x[i]) < 65536.0f;
  if (!fits) return false;
  const __m256 s = _mm256_set1_ps(0x1p112f);
  for (i = 0; i + 8 <= count; i += 8)
    _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), s));
  for (; i < count; ++i) x[i] *= 0x1p112f;
  return true;
}

void gemm_tiles_block(const float* x, int64_t m, int64_t k, const uint8_t* w, int64_t n,
                      const float* scale, int64_t bn, int64_t bk, const float* bias,
                      uint16_t* y, int64_t t0, int64_t t1, float* xs) {
  const int64_t per = bn / kW, k_blocks = (k + bk - 1) / bk;
  for (int64_t a = t0; a < t1;) {
    const int64_t c = a / per, b = t1 < (c + 1) * per ? t1 : (c + 1) * per;
    scale_x_blocks(x, m, k, scale + c * k_blocks, bk, xs);
    gemm_tiles(xs, m, k, w, n, nullptr, bias, y, a, b, prescale_x(xs, m * k));
    a = b;
  }
}

}  // namespace avx2
}  // namespace fp8serve

ISA_END
