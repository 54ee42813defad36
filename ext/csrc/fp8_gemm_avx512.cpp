// AVX-512 (F, BW, VL, BF16) FP8 kernels: conversion, the batch-invariant GEMM (direct
// and panel paths, avx512_kernels.inc), and the exact tile unpack the AMX kernel
// (amx_gemm_tiles.cpp) feeds its tiles from. Compiled for AVX-512 only (ISA_BEGIN); called only when
// dispatch.cpp chose Isa::kAvx512 or higher. No torch or STL headers here.
//
// FP8 e4m3 -> BF16 in registers: fp8_cvt_avx512.inc.
#include <immintrin.h>

#include "isa.h"

ISA_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")

namespace fp8serve {
namespace avx512 {
namespace {

#include "fp8_cvt_avx512.inc"
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

void unpack_tile(const uint8_t* w, int64_t p0, int64_t p1, uint16_t* dst,
                 const float* block_scale, int64_t block_k) {
  unpack_tile_impl<Cvt<true>>(w, p0, p1, dst, block_scale, block_k);
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
