// AVX-512 (F, BW, VL, BF16) FP8 kernels: conversion, the decode GEMV, and the tile
// unpack / epilogue used around brgemm. Compiled for AVX-512 only (ISA_BEGIN); called
// only when dispatch.cpp chose Isa::kAvx512 or higher. No torch or STL headers here.
//
// FP8 e4m3 -> BF16 in registers (32 codes per zmm):
//   s = sign-extend(code) to 16 bits; t = s << 4 puts the 7 magnitude bits at 10..4.
//   normal codes: bf16 = sign | ((t & 0x07F0) + 0x3C00)  (exponent + 120: exact value)
//            or   bf16 = sign | (t & 0x07F0) | 0x3800    (exponent + 112: value * 2^-8,
//                                                         one ternlog; the GEMV uses it
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
constexpr float kUnscale = 256.0f;  // undoes the 2^-8 of the scaled encoding

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
  inline __m512i operator()(__m256i raw) const {
    const __m512i s = _mm512_cvtepi8_epi16(raw);
    const __m512i t = _mm512_slli_epi16(s, 4);
    __m512i v = kExact ? _mm512_add_epi16(_mm512_and_si512(t, mag), bias)
                       : _mm512_ternarylogic_epi32(t, mag, bias, 0xEA);  // (t&mag)|bias
    const __mmask32 sub = _mm512_testn_epi16_mask(s, expo);
    v = _mm512_mask_permutexvar_epi16(v, sub, s, table);
    return _mm512_ternarylogic_epi32(v, s, sign, 0xF8);  // v | (s & 0x8000)
  }
};

inline __m512 dp(__m512 acc, __m512i w, __m512i x) {
  return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)x);
}

// acc[r][h] += sum over k-pairs [p0, p1) of w(tile t) * x(row m0 + r); h = column half.
// U independent accumulator sets hide the dpbf16 latency when R is small.
template <int R, int U>
inline void accumulate(const GemvArgs& a, const Cvt<false>& cvt, int64_t m0, int64_t t,
                       int64_t p0, int64_t p1, __m512 acc[R][2]) {
  const uint8_t* w = a.w + (t * (a.kp / 2) + p0) * 64;
  const uint16_t* x = a.x + m0 * a.ldx + 2 * p0;
  __m512 c[U][R][2];
  for (int u = 0; u < U; ++u)
    for (int r = 0; r < R; ++r) c[u][r][0] = c[u][r][1] = _mm512_setzero_ps();
  for (int64_t p = p0; p < p1; p += U, w += 64 * U, x += 2 * U) {
    _mm_prefetch(reinterpret_cast<const char*>(w) + 64 * 16, _MM_HINT_T0);
    for (int u = 0; u < U; ++u) {
      const __m512i lo = cvt(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 64 * u)));
      const __m512i hi =
          cvt(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 64 * u + 32)));
      for (int r = 0; r < R; ++r) {
        const int32_t pair = *reinterpret_cast<const int32_t*>(x + r * a.ldx + 2 * u);
        const __m512i xb = _mm512_set1_epi32(pair);
        c[u][r][0] = dp(c[u][r][0], lo, xb);
        c[u][r][1] = dp(c[u][r][1], hi, xb);
      }
    }
  }
  for (int u = 0; u < U; ++u)
    for (int r = 0; r < R; ++r) {
      acc[r][0] = _mm512_add_ps(acc[r][0], c[u][r][0]);
      acc[r][1] = _mm512_add_ps(acc[r][1], c[u][r][1]);
    }
}

inline __mmask16 col_mask(int64_t cols) {
  return cols >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << cols) - 1u);
}

// Rows m0 .. m0+R-1 of tile t: y = acc * scale + bias, bf16 (round to nearest even).
template <int R>
void store_rows(const GemvArgs& a, int64_t m0, int64_t t, __m512 acc[R][2], bool scaled) {
  for (int h = 0; h < 2; ++h) {
    const int64_t n0 = t * kTileN + 16 * h;
    if (n0 >= a.n) break;
    const __mmask16 k = col_mask(a.n - n0);
    __m512 mul = _mm512_set1_ps(kUnscale);
    if (scaled) mul = _mm512_mul_ps(mul, _mm512_maskz_loadu_ps(k, a.scale + n0));
    const __m512 add = a.bias ? _mm512_maskz_loadu_ps(k, a.bias + n0) : _mm512_setzero_ps();
    for (int r = 0; r < R; ++r) {
      const __m512 v = _mm512_fmadd_ps(acc[r][h], mul, add);
      _mm256_mask_storeu_epi16(a.y + (m0 + r) * a.n + n0, k, (__m256i)_mm512_cvtneps_pbh(v));
    }
  }
}

template <int R>
void tile_rows(const GemvArgs& a, const Cvt<false>& cvt, int64_t m0, int64_t t) {
  constexpr int U = R == 1 ? 4 : (R == 2 ? 2 : 1);
  const int64_t pairs = a.kp / 2;
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) acc[r][0] = acc[r][1] = _mm512_setzero_ps();
  if (a.block_k == 0) {
    accumulate<R, U>(a, cvt, m0, t, 0, pairs, acc);
    store_rows<R>(a, m0, t, acc, true);
    return;
  }
  // Block scales: each 32-column tile lies in one n-block (block_n % 32 == 0); the
  // scale multiplies the fp32 partial sum of each k-block.
  const float* srow = a.scale + (t * kTileN / a.block_n) * a.k_blocks;
  const int64_t bp = a.block_k / 2;
  for (int64_t kb = 0; kb * bp < pairs; ++kb) {
    __m512 part[R][2];
    for (int r = 0; r < R; ++r) part[r][0] = part[r][1] = _mm512_setzero_ps();
    const int64_t p1 = (kb + 1) * bp < pairs ? (kb + 1) * bp : pairs;
    accumulate<R, U>(a, cvt, m0, t, kb * bp, p1, part);
    const __m512 s = _mm512_set1_ps(srow[kb]);
    for (int r = 0; r < R; ++r) {
      acc[r][0] = _mm512_fmadd_ps(part[r][0], s, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(part[r][1], s, acc[r][1]);
    }
  }
  store_rows<R>(a, m0, t, acc, false);
}

}  // namespace

void fp8_to_bf16(const uint8_t* src, uint16_t* dst, int64_t n) {
  const Cvt<true> cvt;
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    _mm512_storeu_si512(dst + i, cvt(raw));
  }
  if (i < n) {
    const __mmask32 k = static_cast<__mmask32>((1ull << (n - i)) - 1ull);
    _mm512_mask_storeu_epi16(dst + i, k, cvt(_mm256_maskz_loadu_epi8(k, src + i)));
  }
}

void gemv_tiles(const GemvArgs& a, int64_t t0, int64_t t1) {
  const Cvt<false> cvt;
  for (int64_t t = t0; t < t1; ++t) {
    for (int64_t m0 = 0; m0 < a.m; m0 += 4) {
      switch (a.m - m0 >= 4 ? 4 : a.m - m0) {
        case 1: tile_rows<1>(a, cvt, m0, t); break;
        case 2: tile_rows<2>(a, cvt, m0, t); break;
        case 3: tile_rows<3>(a, cvt, m0, t); break;
        default: tile_rows<4>(a, cvt, m0, t); break;
      }
    }
  }
}

void unpack_tile(const uint8_t* w, int64_t p0, int64_t p1, uint16_t* dst,
                 const float* block_scale, int64_t block_k) {
  const Cvt<true> cvt;
  for (int64_t p = p0; p < p1; ++p, w += 64, dst += 64) {
    const __m512i lo = cvt(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w)));
    const __m512i hi = cvt(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(w + 32)));
    if (block_scale == nullptr) {
      _mm512_storeu_si512(dst, lo);
      _mm512_storeu_si512(dst + 32, hi);
      continue;
    }
    const __m512 s = _mm512_set1_ps(block_scale[(2 * p) / block_k]);
    const __m512i both[2] = {lo, hi};
    for (int h = 0; h < 2; ++h) {
      const __m512i v = both[h];
      const __m512 f0 = _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_castsi512_si256(v)), 16));
      const __m512 f1 = _mm512_castsi512_ps(
          _mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm512_extracti64x4_epi64(v, 1)), 16));
      const __m512bh out = _mm512_cvtne2ps_pbh(_mm512_mul_ps(f1, s), _mm512_mul_ps(f0, s));
      _mm512_storeu_si512(dst + 32 * h, (__m512i)out);
    }
  }
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
