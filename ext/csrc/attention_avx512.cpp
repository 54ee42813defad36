// AVX-512 paged attention (contract in attention.h). Compiled for AVX-512 only
// (ISA_BEGIN); called only when dispatch.cpp chose Isa::kAvx512 or higher.
//
// Per item (token t, KV head h), G query heads at once (q and K stay bf16):
//   for each key tile [j0, j0 + 16) in position order (the last one partial):
//     s[g][j]  = scale * dot(q[g], K[slot(j), h])       (dpbf16 over d in order, then
//                                                        one fixed 16-lane shuffle tree)
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
  float acc[kMaxGroup][kMaxHeadDim];
  float s[kMaxGroup][kKeyTile];
  float m[kMaxGroup], l[kMaxGroup];
};

const uint16_t* row(const AttnArgs& a, const uint16_t* cache, const int32_t* bt, int64_t j,
                    int64_t h) {
  const int64_t slot = int64_t(bt[j / a.block_size]) * a.block_size + j % a.block_size;
  return cache + (slot * a.hkv + h) * a.d;
}

// v[j] = sum of the 16 lanes of x[j], j < 16 (a fixed shuffle tree: within 128-bit lanes,
// then across them).
inline __m512 reduce16(const __m512 x[16]) {
  __m512 r[8], s[4];
  for (int i = 0; i < 8; ++i) {
    r[i] = _mm512_add_ps(_mm512_unpacklo_ps(x[2 * i], x[2 * i + 1]),
                         _mm512_unpackhi_ps(x[2 * i], x[2 * i + 1]));
  }
  for (int i = 0; i < 4; ++i) {
    s[i] = _mm512_add_ps(_mm512_shuffle_ps(r[2 * i], r[2 * i + 1], 0x44),
                         _mm512_shuffle_ps(r[2 * i], r[2 * i + 1], 0xEE));
  }
  const __m512 v01 = _mm512_add_ps(_mm512_shuffle_f32x4(s[0], s[1], 0x44),
                                   _mm512_shuffle_f32x4(s[0], s[1], 0xEE));
  const __m512 v23 = _mm512_add_ps(_mm512_shuffle_f32x4(s[2], s[3], 0x44),
                                   _mm512_shuffle_f32x4(s[2], s[3], 0xEE));
  return _mm512_add_ps(_mm512_shuffle_f32x4(v01, v23, 0x88),
                       _mm512_shuffle_f32x4(v01, v23, 0xDD));
}

alignas(64) const uint16_t kZeroRow[kMaxHeadDim] = {};

// s[g][jj] = scale * (q[g] . K[j0 + jj]) for jj < n (lanes >= n hold 0): bf16 pairs
// multiplied into fp32 sums by dpbf16 (q and K stay bf16), then one 16-lane tree.
void scores(const AttnArgs& a, Item& it, const int32_t* bt, int64_t h, int64_t g_n,
            int64_t j0, int64_t n, const uint16_t* q) {
  const uint16_t* kr[kKeyTile];
  for (int64_t jj = 0; jj < kKeyTile; ++jj) {
    kr[jj] = jj < n ? row(a, a.k, bt, j0 + jj, h) : kZeroRow;
  }
  const __m512 scale = _mm512_set1_ps(a.scale);
  for (int64_t g = 0; g < g_n; ++g) {
    const uint16_t* qg = q + g * a.q_sh;
    __m512 dot[kKeyTile];
    for (int jj = 0; jj < kKeyTile; ++jj) dot[jj] = _mm512_setzero_ps();
    for (int64_t c = 0; c < a.d; c += 32) {
      const __m512bh qc = (__m512bh)_mm512_loadu_si512(qg + c);
      for (int jj = 0; jj < kKeyTile; ++jj) {
        dot[jj] = _mm512_dpbf16_ps(dot[jj], qc, (__m512bh)_mm512_loadu_si512(kr[jj] + c));
      }
    }
    _mm512_storeu_ps(it.s[g], _mm512_mul_ps(reduce16(dot), scale));
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

// acc[g] += sum_jj p[g][jj] V[j0 + jj], per 16-wide column chunk in registers
void accumulate_v(const AttnArgs& a, Item& it, const int32_t* bt, int64_t h, int64_t g_n,
                  int64_t j0, int64_t n) {
  const uint16_t* vr[kKeyTile];
  for (int64_t jj = 0; jj < n; ++jj) vr[jj] = row(a, a.v, bt, j0 + jj, h);
  for (int64_t c = 0; c < a.d; c += 16) {
    __m512 acc[kMaxGroup];
    for (int64_t g = 0; g < g_n; ++g) acc[g] = _mm512_loadu_ps(it.acc[g] + c);
    for (int64_t jj = 0; jj < n; ++jj) {
      const __m512 vc = load_bf16(vr[jj] + c);
      for (int64_t g = 0; g < g_n; ++g) {
        acc[g] = _mm512_fmadd_ps(_mm512_set1_ps(it.s[g][jj]), vc, acc[g]);
      }
    }
    for (int64_t g = 0; g < g_n; ++g) _mm512_storeu_ps(it.acc[g] + c, acc[g]);
  }
}

// Software prefetch of the K and V rows of keys [j0, j1): rows are scattered over blocks,
// so the hardware prefetcher sees no stream.
void prefetch_tile(const AttnArgs& a, const int32_t* bt, int64_t h, int64_t j0, int64_t j1) {
  for (int64_t j = j0; j < j1; ++j) {
    const char* kr = reinterpret_cast<const char*>(row(a, a.k, bt, j, h));
    const char* vr = reinterpret_cast<const char*>(row(a, a.v, bt, j, h));
    for (int64_t off = 0; off < a.d * 2; off += 64) {
      _mm_prefetch(kr + off, _MM_HINT_T0);
      _mm_prefetch(vr + off, _MM_HINT_T0);
    }
  }
}

void attend_one(const AttnArgs& a, Item& it, int64_t t, int64_t h) {
  const int64_t g_n = a.hq / a.hkv, len = a.ctx_lens[t];
  const int32_t* bt = a.block_tables + int64_t(a.token_seq[t]) * a.bt_stride;
  const uint16_t* q = a.q + t * a.q_st + h * g_n * a.q_sh;
  for (int64_t g = 0; g < g_n; ++g) {
    for (int64_t c = 0; c < a.d; c += 16) _mm512_storeu_ps(it.acc[g] + c, _mm512_setzero_ps());
    it.m[g] = -__builtin_inff();
    it.l[g] = 0.0f;
  }
  for (int64_t j0 = 0; j0 < len; j0 += kKeyTile) {
    const int64_t n = len - j0 < kKeyTile ? len - j0 : kKeyTile;
    const int64_t next = j0 + kKeyTile + kKeyTile < len ? j0 + 2 * kKeyTile : len;
    prefetch_tile(a, bt, h, j0 + n, next);
    scores(a, it, bt, h, g_n, j0, n, q);
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
