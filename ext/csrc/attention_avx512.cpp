// AVX-512 paged attention (contract in attention.h). Compiled for AVX-512 only
// (ISA_BEGIN); called only when dispatch.cpp chose Isa::kAvx512 or higher.
//
// Per item (token t, KV head h), G query heads at once:
//   qf[g] = fp32(q[t, hG + g]) * scale
//   for each key tile [j0, j0 + 16) in position order (the last one partial):
//     s[g][j]  = dot(qf[g], K[slot(j), h])              (fp32 FMAs over d, fixed order)
//     m'       = max(m, max_j s);  alpha = exp(m - m');  p = exp(s - m')
//     l        = l * alpha + sum_j p (one 16-lane reduction); acc = acc * alpha + sum_j p_j V_j
//   out[t, hG + g] = bf16(acc / l)
// exp is a fixed polynomial (Cody-Waite reduction, degree-6, scalef), so results are
// reproducible across calls. No torch or STL headers here.
#include <immintrin.h>

#include "attention.h"
#include "isa.h"

ISA_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")

namespace fp8serve {
namespace avx512 {
namespace {

#include "avx512_math.inc"

struct Item {
  float qf[kMaxGroup][kMaxHeadDim];
  float acc[kMaxGroup][kMaxHeadDim];
  float s[kMaxGroup][kKeyTile];
  float m[kMaxGroup], l[kMaxGroup];
};

const uint16_t* row(const AttnArgs& a, const uint16_t* cache, const int32_t* bt, int64_t j,
                    int64_t h) {
  const int64_t slot = int64_t(bt[j / a.block_size]) * a.block_size + j % a.block_size;
  return cache + (slot * a.hkv + h) * a.d;
}

// s[g][jj] = qf[g] . K[j0 + jj] for jj < n
void scores(const AttnArgs& a, Item& it, const int32_t* bt, int64_t h, int64_t g_n,
            int64_t j0, int64_t n) {
  const int64_t nv = a.d / 16;
  for (int64_t jj = 0; jj < n; ++jj) {
    const uint16_t* kr = row(a, a.k, bt, j0 + jj, h);
    __m512 dot[kMaxGroup];
    for (int64_t g = 0; g < g_n; ++g) dot[g] = _mm512_setzero_ps();
    for (int64_t c = 0; c < nv; ++c) {
      const __m512 kc = load_bf16(kr + 16 * c);
      for (int64_t g = 0; g < g_n; ++g) {
        dot[g] = _mm512_fmadd_ps(_mm512_loadu_ps(it.qf[g] + 16 * c), kc, dot[g]);
      }
    }
    for (int64_t g = 0; g < g_n; ++g) it.s[g][jj] = _mm512_reduce_add_ps(dot[g]);
  }
}

// Online-softmax update of one tile: rescale acc, turn s into p (masked lanes 0).
void softmax_tile(Item& it, int64_t g_n, int64_t n, int64_t d) {
  const __mmask16 valid = static_cast<__mmask16>((1u << n) - 1u);
  const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
  for (int64_t g = 0; g < g_n; ++g) {
    const __m512 sv = _mm512_mask_loadu_ps(ninf, valid, it.s[g]);
    const float m_new = __builtin_fmaxf(it.m[g], _mm512_reduce_max_ps(sv));
    const __m512 p = _mm512_maskz_mov_ps(valid, exp_ps(_mm512_sub_ps(sv, _mm512_set1_ps(m_new))));
    const __m512 alpha = exp_ps(_mm512_set1_ps(it.m[g] - m_new));
    it.l[g] = it.l[g] * _mm512_cvtss_f32(alpha) + _mm512_reduce_add_ps(p);
    it.m[g] = m_new;
    _mm512_storeu_ps(it.s[g], p);
    for (int64_t c = 0; c < d; c += 16) {
      _mm512_storeu_ps(it.acc[g] + c, _mm512_mul_ps(_mm512_loadu_ps(it.acc[g] + c), alpha));
    }
  }
}

void accumulate_v(const AttnArgs& a, Item& it, const int32_t* bt, int64_t h, int64_t g_n,
                  int64_t j0, int64_t n) {
  for (int64_t jj = 0; jj < n; ++jj) {
    const uint16_t* vr = row(a, a.v, bt, j0 + jj, h);
    for (int64_t c = 0; c < a.d; c += 16) {
      const __m512 vc = load_bf16(vr + c);
      for (int64_t g = 0; g < g_n; ++g) {
        float* dst = it.acc[g] + c;
        _mm512_storeu_ps(dst, _mm512_fmadd_ps(_mm512_set1_ps(it.s[g][jj]), vc,
                                              _mm512_loadu_ps(dst)));
      }
    }
  }
}

void attend_one(const AttnArgs& a, Item& it, int64_t t, int64_t h) {
  const int64_t g_n = a.hq / a.hkv, len = a.ctx_lens[t];
  const int32_t* bt = a.block_tables + int64_t(a.token_seq[t]) * a.bt_stride;
  const __m512 scale = _mm512_set1_ps(a.scale);
  for (int64_t g = 0; g < g_n; ++g) {
    const uint16_t* qr = a.q + t * a.q_st + (h * g_n + g) * a.q_sh;
    for (int64_t c = 0; c < a.d; c += 16) {
      _mm512_storeu_ps(it.qf[g] + c, _mm512_mul_ps(load_bf16(qr + c), scale));
      _mm512_storeu_ps(it.acc[g] + c, _mm512_setzero_ps());
    }
    it.m[g] = -__builtin_inff();
    it.l[g] = 0.0f;
  }
  for (int64_t j0 = 0; j0 < len; j0 += kKeyTile) {
    const int64_t n = len - j0 < kKeyTile ? len - j0 : kKeyTile;
    scores(a, it, bt, h, g_n, j0, n);
    softmax_tile(it, g_n, n, a.d);
    accumulate_v(a, it, bt, h, g_n, j0, n);
  }
  for (int64_t g = 0; g < g_n; ++g) {
    uint16_t* o = a.out + t * a.out_st + (h * g_n + g) * a.d;
    const __m512 inv = _mm512_set1_ps(1.0f / it.l[g]);
    for (int64_t c = 0; c < a.d; c += 16) {
      const __m512 r = _mm512_mul_ps(_mm512_loadu_ps(it.acc[g] + c), inv);
      store_bf16(o + c, r);
    }
  }
}

}  // namespace

void attend_items(const AttnArgs& a, int64_t i0, int64_t i1) {
  alignas(64) Item it;
  for (int64_t i = i0; i < i1; ++i) attend_one(a, it, i / a.hkv, i % a.hkv);
}

}  // namespace avx512
}  // namespace fp8serve

ISA_END
