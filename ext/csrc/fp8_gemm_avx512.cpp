// AVX-512 (F, BW, VL, BF16) FP8 kernels: conversion and the batch-invariant GEMM (direct
// and panel paths, avx512_kernels.inc). Compiled for AVX-512 only (ISA_BEGIN); called only
// when dispatch.cpp chose Isa::kAvx512 or higher. No torch or STL headers here.
//
// FP8 e4m3 -> BF16 in registers (32 codes per zmm):
//   s = sign-extend(code) to 16 bits; t = s << 4 puts the 7 magnitude bits at 10..4.
//   normal codes: bf16 = sign | ((t & 0x07F0) + 0x3C00)  (exponent + 120: exact value)
//            or   bf16 = sign | (t & 0x07F0) | 0x3800    (exponent + 112: value * 2^-8,
//                                                         one ternlog; the GEMM uses it
//                                                         and folds 256 into the scale)
//   exponent-0 codes (zero and subnormals m * 2^-9) are replaced from an 8-entry table
//   indexed by the mantissa (vpermw under a mask), so they land as exact bf16 *normals*:
//   _mm512_dpbf16_ps treats bf16 denormals as zero, which the vLLM-style
//   (x & 0x7F) << 4 (value * 2^-120) encoding would hit for every small weight.
#include <immintrin.h>

#include "isa.h"

ISA_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")

namespace fp8serve {
namespace avx512 {
namespace {

alignas(64) const uint16_t kSubExact[32] = {  // m * 2^-9, m = 0..7
    0x0000, 0x3B00, 0x3B80, 0x3BC0, 0x3C00, 0x3C20, 0x3C40, 0x3C60};
alignas(64) const uint16_t kSubScaled[32] = {  // m * 2^-17
    0x0000, 0x3700, 0x3780, 0x37C0, 0x3800, 0x3820, 0x3840, 0x3860};

template <bool kExact>
struct Cvt {
  __m512i mag, bias, expo, sign, table;

  // An explicit constructor: GCC does not apply the target pragma to implicit ones.
  Cvt()
      : mag(_mm512_set1_epi16(0x07F0)),
        bias(_mm512_set1_epi16(kExact ? 0x3C00 : 0x3800)),
        expo(_mm512_set1_epi16(0x0078)),
        sign(_mm512_set1_epi16(static_cast<short>(0x8000))),
        table(_mm512_load_si512(kExact ? kSubExact : kSubScaled)) {}

  // 32 fp8 bytes -> 32 bf16 (see file comment)
  inline __m512i one(__m256i raw) const {
    const __m512i s = _mm512_cvtepi8_epi16(raw);
    const __m512i t = _mm512_slli_epi16(s, 4);
    __m512i v = kExact ? _mm512_add_epi16(_mm512_and_si512(t, mag), bias)
                       : _mm512_ternarylogic_epi32(t, mag, bias, 0xEA);  // (t&mag)|bias
    const __mmask32 sub = _mm512_testn_epi16_mask(s, expo);
    v = _mm512_mask_permutexvar_epi16(v, sub, s, table);
    return _mm512_ternarylogic_epi32(v, s, sign, 0xF8);  // v | (s & 0x8000)
  }

  inline void operator()(const uint8_t* p, __m512i& lo, __m512i& hi) const {
    lo = one(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    hi = one(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
  }
};

#include "avx512_kernels.inc"

}  // namespace

void fp8_to_bf16(const uint8_t* src, uint16_t* dst, int64_t n) {
  const Cvt<true> cvt;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_si512(dst + i, cvt.one(raw));
  }
  if (i < n) {
    const __mmask32 k = static_cast<__mmask32>((1ull << (n - i)) - 1ull);
    _mm512_mask_storeu_epi16(dst + i, k, cvt.one(_mm256_maskz_loadu_epi8(k, src + i)));
  }
}

void direct_tiles(const GemvArgs& a, int64_t t0, int64_t t1) {
  direct_tiles_impl<Cvt<false>>(a, t0, t1);
}

void panel_tiles(const GemvArgs& a, int64_t t0, int64_t t1) {
  panel_tiles_impl<Cvt<false>>(a, t0, t1);
}

void epilogue(const float* c, int64_t rows, const float* scale, float mult, const float* bias,
              uint16_t* y, int64_t ldy, int64_t cols) {
  for (int h = 0; h < 2 && 16 * h < cols; ++h) {
    const __mmask16 k = col_mask(cols - 16 * h);
    __m512 mul = _mm512_set1_ps(mult);
    if (scale) mul = _mm512_mul_ps(mul, _mm512_maskz_loadu_ps(k, scale + 16 * h));
    const __m512 add = bias ? _mm512_maskz_loadu_ps(k, bias + 16 * h) : _mm512_setzero_ps();
    for (int64_t r = 0; r < rows; ++r) {
      const __m512 v = _mm512_fmadd_ps(_mm512_loadu_ps(c + r * kTileN + 16 * h), mul, add);
      _mm256_mask_storeu_epi16(y + r * ldy + 16 * h, k, (__m256i)_mm512_cvtneps_pbh(v));
    }
  }
}

}  // namespace avx512
}  // namespace fp8serve

ISA_END
