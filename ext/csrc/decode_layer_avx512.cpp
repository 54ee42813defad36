// AVX-512 elementwise kernels of the fused decoder layer (contract in decode_layer.h).
// Compiled for AVX-512 only (ISA_BEGIN); the fused layer runs only on AVX-512 hosts.
#include <immintrin.h>

#include "decode_layer.h"
#include "isa.h"

ISA_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")

namespace fp8serve {
namespace avx512 {
namespace {
#include "avx512_math.inc"
}  // namespace

void rms_norm_row(const uint16_t* x, const uint16_t* w, int64_t n, float eps, uint16_t* out) {
  __m512 ss = _mm512_setzero_ps();
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 v = load_bf16(x + i, tail_mask(n - i));
    ss = _mm512_fmadd_ps(v, v, ss);
  }
  const float inv = 1.0f / __builtin_sqrtf(_mm512_reduce_add_ps(ss) / float(n) + eps);
  const __m512 vinv = _mm512_set1_ps(inv);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 normed = round_bf16(_mm512_mul_ps(load_bf16(x + i, k), vinv));
    store_bf16(out + i, _mm512_mul_ps(load_bf16(w + i, k), normed), k);
  }
}

void rope_row(uint16_t* x, const float* cos, const float* sin, int64_t half) {
  for (int64_t i = 0; i < half; i += 16) {
    const __mmask16 k = tail_mask(half - i);
    const __m512 x1 = load_bf16(x + i, k), x2 = load_bf16(x + half + i, k);
    const __m512 c = _mm512_maskz_loadu_ps(k, cos + i), s = _mm512_maskz_loadu_ps(k, sin + i);
    store_bf16(x + i, _mm512_fmsub_ps(x1, c, _mm512_mul_ps(x2, s)), k);
    store_bf16(x + half + i, _mm512_fmadd_ps(x2, c, _mm512_mul_ps(x1, s)), k);
  }
}

void silu_mul_row(const uint16_t* gate, const uint16_t* up, int64_t n, uint16_t* out) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    const __m512 g = load_bf16(gate + i, k);
    const __m512 e = exp_ps(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 silu = round_bf16(_mm512_div_ps(g, _mm512_add_ps(one, e)));
    store_bf16(out + i, _mm512_mul_ps(silu, load_bf16(up + i, k)), k);
  }
}

void add_row(uint16_t* h, const uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; i += 16) {
    const __mmask16 k = tail_mask(n - i);
    store_bf16(h + i, _mm512_add_ps(load_bf16(h + i, k), load_bf16(y + i, k)), k);
  }
}

}  // namespace avx512
}  // namespace fp8serve

ISA_END
