// AVX2 + FMA + F16C paged attention (contract and segment merge in attention.h), for bf16
// caches and the FP8 form (AttnArgs k8 set). Compiled for that ISA only (ISA_BEGIN); called
// only when dispatch.cpp chose Isa::kAvx2 or higher. No torch or STL headers here.
//
// Per (token t, KV head h, segment [j0, j1)), the G query heads at once (q widened to fp32
// once per segment; K/V rows widened to fp32 in registers, 8 values at a time: bf16 by a
// shift, e4m3 through fp16 bits and vcvtph2ps, which gives value * 2^-8; the 2^8 is folded
// into the row's dequant scale, so K = ks' * k16, ks' = 256 ks, exactly):
//   for each key tile [j, j + 16) in position order (the last one partial):
//     s[g][jj] = (dot(q[g], k16[jj]) * ks'[jj]) * scale  (8-lane fma chain over d in
//                                                         order, then reduce8's fixed tree)
//     m'       = max(m, max_j s);  alpha = exp(m - m');  p = exp(s - m')
//     l        = l * alpha + sum_j p (one fixed 8-lane tree over p[0:8] + p[8:16])
//     acc      = acc * alpha + sum_j (p_j vs'_j) v16_j  (one fma per key, in key order)
// then segments merge in order (attention.h) and out[t, hG + g] = bf16(acc * (1 / l)).
// How heads, keys and columns are blocked into registers never changes an element's
// operations, so a row's bits depend on that row alone. exp is avx2_math.inc's fixed
// polynomial (reproducible across calls).
#include <immintrin.h>

#include "attention.h"
#include "isa.h"

ISA_BEGIN("avx2,fma,f16c")

namespace fp8serve {
namespace avx2 {
namespace {

#include "avx2_math.inc"

constexpr float kE4m3Unscale = 256.0f;  // load_e4m3_div256 gives value * 2^-8

// Running (or one segment's) state of the G query heads of one (t, h).
struct Item {
  float acc[kMaxGroup][kMaxHeadDim];
  float s[kMaxGroup][kKeyTile];  // scores, then the tile's V weights p * vs'
  float m[kMaxGroup], l[kMaxGroup];
};

struct QRows {  // the G query rows of (t, h) in fp32, kMaxHeadDim apart
  float q[kMaxGroup][kMaxHeadDim];
};

// The rows of one key tile: element offsets (row (slot, h) * d) into the caches and the
// dequant scales ks' / vs' (1 for bf16; 256 ks / 256 vs for e4m3; 0 past n).
struct Tile {
  int64_t n;
  int64_t off[kKeyTile];
  float ks[kKeyTile], vs[kKeyTile];
};

alignas(64) const uint16_t kZeroRow[kMaxHeadDim] = {};

inline __m256 widen(const uint16_t* p) { return load_bf16(p); }
inline __m256 widen(const uint8_t* p) { return load_e4m3_div256(p); }

// Keys [j, j + n) of KV head h: one division per tile, the block walked incrementally
// (rows kv_row(slot, h): a head's rows of one block are adjacent).
void fill_tile(const AttnArgs& a, const int32_t* bt, int64_t h, int64_t j, int64_t n,
               Tile& tl) {
  int64_t b = j / a.block_size, o = j - b * a.block_size;
  int64_t base = (int64_t(bt[b]) * a.hkv + h) * a.block_size;
  tl.n = n;
  for (int64_t jj = 0; jj < kKeyTile; ++jj) {
    if (jj >= n) {
      tl.off[jj] = 0;
      tl.ks[jj] = tl.vs[jj] = 0.0f;
      continue;
    }
    const int64_t row = base + o;
    tl.off[jj] = row * a.d;
    tl.ks[jj] = a.k8 ? a.ks[row] * kE4m3Unscale : 1.0f;
    tl.vs[jj] = a.k8 ? a.vs[row] * kE4m3Unscale : 1.0f;
    if (++o == a.block_size && jj + 1 < n) {
      o = 0;
      base = (int64_t(bt[++b]) * a.hkv + h) * a.block_size;
    }
  }
}

// Next-tile prefetches (tile_prefetch.inc) into L1, spread over the current tile's work:
// one key after each block of scores and two after each column chunk of P V, the rest at
// the end. Issued in one burst before the tile (as before), 128 lines at d = 128 bf16
// stalled the loads and arithmetic behind them, and the kernel's DRAM reads and compute did
// not overlap. Measured on Zen 2, one row x 16384 keys of the 8B shape (8 KV heads, G = 4,
// d = 128), 2 threads: 11.9 ms in a burst, 5.4-5.8 ms spread (with the head-major blocks
// of attention.h; 10.6 ms spread over the old token-major rows).
#include "tile_prefetch.inc"

template <typename T>
using Prefetch = TilePrefetch<T, _MM_HINT_T0>;

// dv[g][jj] = the 8 lane sums of q[g0 + g] * k16[jj] for GB heads and keys jj in
// [j, j + KB): each a fma chain over d in order from zero (compile-time bounds keep the
// GB x KB accumulators and the GB query chunks in registers).
template <int GB, int KB, typename T>
void dots_fixed(const QRows& q, int64_t g0, const T* const kr[kKeyTile], int64_t j,
                int64_t d, __m256 dv[kMaxGroup][kKeyTile]) {
  __m256 acc[GB][KB];
  for (int g = 0; g < GB; ++g)
    for (int k = 0; k < KB; ++k) acc[g][k] = _mm256_setzero_ps();
  for (int64_t c = 0; c < d; c += 8) {
    __m256 qc[GB];
    for (int g = 0; g < GB; ++g) qc[g] = _mm256_loadu_ps(q.q[g0 + g] + c);
    for (int k = 0; k < KB; ++k) {
      const __m256 kv = widen(kr[j + k] + c);
      for (int g = 0; g < GB; ++g) acc[g][k] = _mm256_fmadd_ps(qc[g], kv, acc[g][k]);
    }
  }
  for (int g = 0; g < GB; ++g)
    for (int k = 0; k < KB; ++k) dv[g0 + g][j + k] = acc[g][k];
}

// Keys [0, n) rounded up to KB (the extra rows are kZeroRow) for GB heads from g0.
// One next-tile key prefetched after each KB keys.
template <int GB, typename T>
void dots_heads(const QRows& q, int64_t g0, const T* const kr[kKeyTile], int64_t n,
                int64_t d, __m256 dv[kMaxGroup][kKeyTile], Prefetch<T>& pf) {
  constexpr int KB = GB == 1 ? 8 : (GB == 2 ? 4 : 2);  // GB x KB = 8 or 6 fma chains
  for (int64_t j = 0; j < n; j += KB) {
    dots_fixed<GB, KB>(q, g0, kr, j, d, dv);
    pf.keys(1);
  }
}

// s[g][jj] = (dot * ks'[jj]) * scale for the tile's keys (lanes past n: 0 or a zero row's).
template <typename T>
void scores(const AttnArgs& a, Item& it, int64_t g_n, const QRows& q, const T* k,
            const Tile& tl, Prefetch<T>& pf) {
  __m256 dv[kMaxGroup][kKeyTile];
  const T* kr[kKeyTile];
  const T* zero = reinterpret_cast<const T*>(kZeroRow);
  for (int64_t jj = 0; jj < kKeyTile; ++jj) kr[jj] = jj < tl.n ? k + tl.off[jj] : zero;
  for (int64_t g0 = 0; g0 < g_n; g0 += 4) {
    switch (g_n - g0 < 4 ? g_n - g0 : 4) {
      case 1: dots_heads<1>(q, g0, kr, tl.n, a.d, dv, pf); break;
      case 2: dots_heads<2>(q, g0, kr, tl.n, a.d, dv, pf); break;
      case 3: dots_heads<3>(q, g0, kr, tl.n, a.d, dv, pf); break;
      default: dots_heads<4>(q, g0, kr, tl.n, a.d, dv, pf); break;
    }
  }
  const __m256 scale = _mm256_set1_ps(a.scale);
  const int64_t halves = tl.n > 8 ? 2 : 1;
  for (int64_t g = 0; g < g_n; ++g) {
    for (int64_t hf = 0; hf < 2; ++hf) {
      __m256 s = _mm256_setzero_ps();
      if (hf < halves) {
        for (int64_t jj = tl.n; jj < 8 * (hf + 1); ++jj) dv[g][jj] = _mm256_setzero_ps();
        s = _mm256_mul_ps(reduce8(dv[g] + 8 * hf), _mm256_loadu_ps(tl.ks + 8 * hf));
        s = _mm256_mul_ps(s, scale);
      }
      _mm256_storeu_ps(it.s[g] + 8 * hf, s);
    }
  }
}

// Online-softmax update of one tile: rescale acc and l, turn s into the V weights p * vs'
// (lanes past n: p = exp(-inf) = 0).
void softmax_tile(Item& it, int64_t g_n, const Tile& tl, int64_t d) {
  const __m256 iota = _mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7);
  const __m256 nv = _mm256_set1_ps(float(tl.n));
  const __m256 ninf = _mm256_set1_ps(-__builtin_inff());
  const __m256 valid0 = _mm256_cmp_ps(iota, nv, _CMP_LT_OQ);
  const __m256 valid1 = _mm256_cmp_ps(_mm256_add_ps(iota, _mm256_set1_ps(8.0f)), nv, _CMP_LT_OQ);
  const __m256 vs0 = _mm256_loadu_ps(tl.vs), vs1 = _mm256_loadu_ps(tl.vs + 8);
  for (int64_t g = 0; g < g_n; ++g) {
    const __m256 s0 = _mm256_blendv_ps(ninf, _mm256_loadu_ps(it.s[g]), valid0);
    const __m256 s1 = _mm256_blendv_ps(ninf, _mm256_loadu_ps(it.s[g] + 8), valid1);
    const float m_new = __builtin_fmaxf(it.m[g], hmax(_mm256_max_ps(s0, s1)));
    const __m256 mv = _mm256_set1_ps(m_new);
    const __m256 p0 = exp_ps(_mm256_sub_ps(s0, mv)), p1 = exp_ps(_mm256_sub_ps(s1, mv));
    _mm256_storeu_ps(it.s[g], _mm256_mul_ps(p0, vs0));
    _mm256_storeu_ps(it.s[g] + 8, _mm256_mul_ps(p1, vs1));
    const float sum = hsum(_mm256_add_ps(p0, p1));
    if (m_new == it.m[g]) {  // alpha = exp(0) = 1 exactly: l * 1 and acc * 1 change nothing
      it.l[g] += sum;
      continue;
    }
    const __m256 alpha = exp_ps(_mm256_set1_ps(it.m[g] - m_new));
    it.l[g] = it.l[g] * _mm256_cvtss_f32(alpha) + sum;
    it.m[g] = m_new;
    for (int64_t c = 0; c < d; c += 8) {
      _mm256_storeu_ps(it.acc[g] + c, _mm256_mul_ps(_mm256_loadu_ps(it.acc[g] + c), alpha));
    }
  }
}

// acc[g0 + g][c0 : c0 + 8 NC] += sum_jj w[g][jj] v16[jj] for GB heads: compile-time
// bounds keep the GB x NC accumulators and the GB weights in registers.
template <int GB, int NC, typename T>
void pv_fixed(Item& it, int64_t g0, const T* v, const Tile& tl, int64_t c0) {
  __m256 acc[GB][NC];
  for (int g = 0; g < GB; ++g)
    for (int c = 0; c < NC; ++c) acc[g][c] = _mm256_loadu_ps(it.acc[g0 + g] + c0 + 8 * c);
  for (int64_t jj = 0; jj < tl.n; ++jj) {
    const T* vr = v + tl.off[jj] + c0;
    __m256 w[GB];
    for (int g = 0; g < GB; ++g) w[g] = _mm256_broadcast_ss(&it.s[g0 + g][jj]);
    for (int c = 0; c < NC; ++c) {
      const __m256 vc = widen(vr + 8 * c);
      for (int g = 0; g < GB; ++g) acc[g][c] = _mm256_fmadd_ps(w[g], vc, acc[g][c]);
    }
  }
  for (int g = 0; g < GB; ++g)
    for (int c = 0; c < NC; ++c) _mm256_storeu_ps(it.acc[g0 + g] + c0 + 8 * c, acc[g][c]);
}

// d is a multiple of 32: chunks of 4 x 8 columns always divide it, 8 x 8 when d % 64 == 0.
// Two next-tile keys prefetched after each chunk.
template <int GB, typename T>
void pv_heads(Item& it, int64_t g0, const T* v, const Tile& tl, int64_t d,
              Prefetch<T>& pf) {
  constexpr int NC = GB == 1 ? 8 : (GB == 2 ? 4 : 2);
  if (NC == 8 && d % 64 != 0) {
    for (int64_t c0 = 0; c0 < d; c0 += 32) {
      pv_fixed<GB, 4>(it, g0, v, tl, c0);
      pf.keys(2);
    }
    return;
  }
  for (int64_t c0 = 0; c0 < d; c0 += 8 * NC) {
    pv_fixed<GB, NC>(it, g0, v, tl, c0);
    pf.keys(2);
  }
}

template <typename T>
void accumulate_v(Item& it, int64_t g_n, const T* v, const Tile& tl, int64_t d,
                  Prefetch<T>& pf) {
  for (int64_t g0 = 0; g0 < g_n; g0 += 4) {
    switch (g_n - g0 < 4 ? g_n - g0 : 4) {
      case 1: pv_heads<1>(it, g0, v, tl, d, pf); break;
      case 2: pv_heads<2>(it, g0, v, tl, d, pf); break;
      case 3: pv_heads<3>(it, g0, v, tl, d, pf); break;
      default: pv_heads<4>(it, g0, v, tl, d, pf); break;
    }
  }
}

using Query = QRows;

void load_query(const AttnArgs& a, Query& q, int64_t t, int64_t h) {
  const int64_t g_n = a.hq / a.hkv;
  const uint16_t* src = a.q + t * a.q_st + h * g_n * a.q_sh;
  for (int64_t g = 0; g < g_n; ++g) {
    for (int64_t c = 0; c < a.d; c += 8) {
      _mm256_storeu_ps(q.q[g] + c, load_bf16(src + g * a.q_sh + c));
    }
  }
}

// One segment [j0, j1) of row (t, h) from scratch into it (acc unnormalized).
template <typename T>
void segment_typed(const AttnArgs& a, Item& it, const QRows& q, int64_t t, int64_t h,
                   int64_t j0, int64_t j1, const T* k, const T* v) {
  const int64_t g_n = a.hq / a.hkv;
  const int32_t* bt = a.block_tables + int64_t(a.token_seq[t]) * a.bt_stride;
  for (int64_t g = 0; g < g_n; ++g) {
    for (int64_t c = 0; c < a.d; c += 8) _mm256_storeu_ps(it.acc[g] + c, _mm256_setzero_ps());
    it.m[g] = -__builtin_inff();
    it.l[g] = 0.0f;
  }
  Tile cur, next;
  fill_tile(a, bt, h, j0, j1 - j0 < kKeyTile ? j1 - j0 : kKeyTile, cur);
  const int64_t len = a.ctx_lens[t];  // the row's keys: the prefetch may run past j1
  for (int64_t j = j0; j < j1; j += kKeyTile) {
    const int64_t j_next = j + kKeyTile;
    next.n = 0;
    // the prefetch runs on past the segment into the row's next keys (see
    // attention_avx512.cpp: +18-27% bf16, +6-13% fp8 here, same measurement)
    if (j_next < len) {
      fill_tile(a, bt, h, j_next, len - j_next < kKeyTile ? len - j_next : kKeyTile, next);
    }
    Prefetch<T> pf{k, v, a.d, next.off, next.n, 0};
    scores(a, it, g_n, q, k, cur, pf);
    softmax_tile(it, g_n, cur, a.d);
    accumulate_v(it, g_n, v, cur, a.d, pf);
    pf.keys(next.n);
    cur = next;
  }
}

void attend_segment(const AttnArgs& a, Item& it, const QRows& q, int64_t t, int64_t h,
                    int64_t j0, int64_t j1) {
  if (a.k8 != nullptr) {
    segment_typed(a, it, q, t, h, j0, j1, a.k8, a.v8);
  } else {
    segment_typed(a, it, q, t, h, j0, j1, a.k, a.v);
  }
}

// The fp32 vector of this ISA, for attention_walk.inc's merge.
struct Lanes {
  using V = __m256;
  static constexpr int64_t kN = 8;
  static V load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, V v) { _mm256_storeu_ps(p, v); }
  static V set1(float x) { return _mm256_set1_ps(x); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static void store_bf16(uint16_t* p, V v) { avx2::store_bf16(p, v); }
  static float exp1(float x) { return _mm256_cvtss_f32(exp_ps(_mm256_set1_ps(x))); }
};

}  // namespace

#include "attention_walk.inc"

}  // namespace avx2
}  // namespace fp8serve

ISA_END
