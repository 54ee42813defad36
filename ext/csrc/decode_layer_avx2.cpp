// AVX2 + FMA + F16C elementwise kernels of the fused decoder layer (contract in
// decode_layer.h): the AVX-512 file's arithmetic on 8 lanes. A row's tail (n % 8) runs
// the same vector code on a zero-padded copy, so every element gets the same operations
// wherever it sits. Compiled for AVX2 only (ISA_BEGIN).
#include <immintrin.h>

#include "decode_layer.h"
#include "isa.h"

ISA_BEGIN("avx2,fma,f16c")

namespace fp8serve {
namespace avx2 {
namespace {
#include "avx2_math.inc"

// fp32 -> nearest-even bf16 value, kept in fp32 (finite inputs, as store_bf16)
inline __m256 round_bf16(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i odd = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7FFF)), odd);
  return _mm256_castsi256_ps(_mm256_and_si256(r, _mm256_set1_epi32(int(0xFFFF0000u))));
}

// A row tail of n < 8 bf16 values, zero padded to one vector.
struct Tail {
  alignas(32) uint16_t v[8] = {};
  Tail(const uint16_t* p, int64_t n) { __builtin_memcpy(v, p, 2 * n); }
};

struct TailF {
  alignas(32) float v[8] = {};
  TailF(const float* p, int64_t n) { __builtin_memcpy(v, p, 4 * n); }
};

}  // namespace

void rms_norm_row(const uint16_t* x, const uint16_t* w, int64_t n, float eps, uint16_t* out) {
  const int64_t body = n & ~int64_t(7);
  __m256 ss = _mm256_setzero_ps();
  for (int64_t i = 0; i < body; i += 8) {
    const __m256 v = load_bf16(x + i);
    ss = _mm256_fmadd_ps(v, v, ss);
  }
  if (body < n) {
    const __m256 v = load_bf16(Tail(x + body, n - body).v);
    ss = _mm256_fmadd_ps(v, v, ss);
  }
  const float inv = 1.0f / __builtin_sqrtf(hsum(ss) / float(n) + eps);
  const __m256 vinv = _mm256_set1_ps(inv);
  auto row = [&](const uint16_t* xi, const uint16_t* wi, uint16_t* o) {
    const __m256 normed = round_bf16(_mm256_mul_ps(load_bf16(xi), vinv));
    store_bf16(o, _mm256_mul_ps(load_bf16(wi), normed));
  };
  for (int64_t i = 0; i < body; i += 8) row(x + i, w + i, out + i);
  if (body < n) {
    Tail o(out + body, 0);
    row(Tail(x + body, n - body).v, Tail(w + body, n - body).v, o.v);
    __builtin_memcpy(out + body, o.v, 2 * (n - body));
  }
}

void rope_row(uint16_t* x, const float* cos, const float* sin, int64_t half) {
  auto rot = [](uint16_t* a, uint16_t* b, const float* c, const float* s) {
    const __m256 x1 = load_bf16(a), x2 = load_bf16(b);
    const __m256 vc = _mm256_loadu_ps(c), vs = _mm256_loadu_ps(s);
    store_bf16(a, _mm256_fmsub_ps(x1, vc, _mm256_mul_ps(x2, vs)));
    store_bf16(b, _mm256_fmadd_ps(x2, vc, _mm256_mul_ps(x1, vs)));
  };
  const int64_t body = half & ~int64_t(7), r = half - body;
  for (int64_t i = 0; i < body; i += 8) rot(x + i, x + half + i, cos + i, sin + i);
  if (r > 0) {
    Tail a(x + body, r), b(x + half + body, r);
    rot(a.v, b.v, TailF(cos + body, r).v, TailF(sin + body, r).v);
    __builtin_memcpy(x + body, a.v, 2 * r);
    __builtin_memcpy(x + half + body, b.v, 2 * r);
  }
}

void silu_mul_row(const uint16_t* gate, const uint16_t* up, int64_t n, uint16_t* out) {
  auto one8 = [](const uint16_t* g16, const uint16_t* u16, uint16_t* o) {
    const __m256 g = load_bf16(g16);
    const __m256 e = exp_ps(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 silu = round_bf16(_mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e)));
    store_bf16(o, _mm256_mul_ps(silu, load_bf16(u16)));
  };
  const int64_t body = n & ~int64_t(7);
  for (int64_t i = 0; i < body; i += 8) one8(gate + i, up + i, out + i);
  if (body < n) {
    Tail o(out + body, 0);
    one8(Tail(gate + body, n - body).v, Tail(up + body, n - body).v, o.v);
    __builtin_memcpy(out + body, o.v, 2 * (n - body));
  }
}

void add_row(uint16_t* h, const uint16_t* y, int64_t n) {
  const int64_t body = n & ~int64_t(7);
  for (int64_t i = 0; i < body; i += 8) {
    store_bf16(h + i, _mm256_add_ps(load_bf16(h + i), load_bf16(y + i)));
  }
  if (body < n) {
    Tail a(h + body, n - body);
    store_bf16(a.v, _mm256_add_ps(load_bf16(a.v), load_bf16(Tail(y + body, n - body).v)));
    __builtin_memcpy(h + body, a.v, 2 * (n - body));
  }
}

}  // namespace avx2
}  // namespace fp8serve

ISA_END
