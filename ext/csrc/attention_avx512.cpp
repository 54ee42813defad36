// AVX-512 paged attention (contract and segment merge in attention.h), for bf16 caches
// and the FP8 form (AttnArgs k8 set). Compiled for AVX-512 only (ISA_BEGIN); called only
// when dispatch.cpp chose Isa::kAvx512 or higher.
//
// Per (token t, KV head h, segment [j0, j1)), G query heads at once (q and K stay bf16):
//   for each key tile [j, j + 16) in position order (the last one partial):
//     s[g][jj] = scale * dot(q[g], K[slot(j + jj), h])  (dpbf16 over d in order, then
//                                                        one fixed 16-lane shuffle tree)
//     m'       = max(m, max_j s);  alpha = exp(m - m');  p = exp(s - m')
//     l        = l * alpha + sum_j p (one 16-lane reduction); acc = acc * alpha + sum_j p_j V_j
// then segments merge in order (attention.h) and out[t, hG + g] = bf16(acc * (1 / l)).
// FP8 caches: each tile's K rows widen once, before its scores, to k16 = e4m3 * 2^-8 in
// bf16 (exact: 4 significant bits), through fp16 bits and vcvtph2ps as in
// attention_avx2.cpp, into a scratch tile the G heads' dots then read as the bf16 path
// reads its cache (widening per head cost G x the conversions: 8B shape, G = 4, the op
// ran no faster than on bf16 K/V); s = (dot(q, k16) * ks') * scale with ks' = 256 ks;
// V rows widen to fp32 the same way and
// the tile's weights become p * vs' (vs' = 256 vs; l still sums p). The bf16 path's
// arithmetic is unchanged by this.
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

constexpr float kE4m3Unscale = 256.0f;  // the fp16 bits below give value * 2^-8

// 16 e4m3 codes -> 16 fp16 bits (s << 15) | ((c & 0x7F) << 7): e4m3(c) * 2^-8 exactly
// (attention_avx2.cpp's load_e4m3_div256). The NaN codes 0x7F / 0xFF would read as a
// finite 480 * 2^-8: the clamped quantizer (kv_fp8.cpp) never writes them.
inline __m256i e4m3_fp16_bits(__m128i codes) {
  const __m256i s = _mm256_cvtepi8_epi16(codes);
  return _mm256_and_si256(_mm256_slli_epi16(s, 7), _mm256_set1_epi16(static_cast<short>(0xBF80)));
}

// 16 fp32 of a V row chunk: bf16 bits, or e4m3 codes as value * 2^-8.
inline __m512 load_v16(const uint16_t* p) { return load_bf16(p); }
inline __m512 load_v16(const uint8_t* p) {
  return _mm512_cvtph_ps(e4m3_fp16_bits(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
}

// 32 bf16 of a K row chunk, the dpbf16 operand (element order kept).
inline __m512bh load_k32(const uint16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }
inline __m512bh load_k32(const uint8_t* p) {
  const __m512 lo = load_v16(p), hi = load_v16(p + 16);
  return _mm512_cvtne2ps_pbh(hi, lo);  // exact: the values have 4 significant bits
}

// Running (or one segment's) state of the G query heads of one (t, h).
struct Item {
  float acc[kMaxGroup][kMaxHeadDim];
  float s[kMaxGroup][kKeyTile];
  float m[kMaxGroup], l[kMaxGroup];
  float ks[kKeyTile], vs[kKeyTile];  // FP8: the tile's dequant scales * 256 (0 past n)
  alignas(64) uint16_t k16[kKeyTile][kMaxHeadDim];  // FP8: the tile's K rows in bf16
};

// FP8: the dequant scales of the tile's rows (element offset off = row * d).
void tile_scales(const AttnArgs& a, Item& it, const int64_t off[kKeyTile], int64_t n) {
  for (int64_t jj = 0; jj < kKeyTile; ++jj) {
    const int64_t row = jj < n ? off[jj] / a.d : 0;
    it.ks[jj] = jj < n ? a.ks[row] * kE4m3Unscale : 0.0f;
    it.vs[jj] = jj < n ? a.vs[row] * kE4m3Unscale : 0.0f;
  }
}

// Element offsets (into a cache) of the rows of keys [j, j + n) of KV head h: one
// division per tile, the block walked incrementally (rows kv_row(slot, h), attention.h: a
// head's rows of one block are adjacent).
void tile_offsets(const AttnArgs& a, const int32_t* bt, int64_t h, int64_t j, int64_t n,
                  int64_t off[kKeyTile]) {
  int64_t b = j / a.block_size, o = j - b * a.block_size;
  int64_t base = (int64_t(bt[b]) * a.hkv + h) * a.block_size * a.d;
  for (int64_t jj = 0; jj < n; ++jj) {
    off[jj] = base + o * a.d;
    if (++o == a.block_size && jj + 1 < n) {
      o = 0;
      base = (int64_t(bt[++b]) * a.hkv + h) * a.block_size * a.d;
    }
  }
}

// Next-tile prefetches (tile_prefetch.inc) into L2 (T1), spread over the current tile's
// work in slices of a few keys (after each query head's scores, the rest between P V's
// column chunks) instead of one burst that stalls the loads behind it. Measured on Zen 5
// with the KV in DRAM, against one burst per tile: 16 rows x 160 keys of the demo model's
// 30 layers 3.8-4.4 vs 4.5-5.0 ms; one row x 4096 keys of the 8B shape's 34 layers 32 vs
// 34 ms. Spreading the last slices over P V rather than issuing them before it (the op
// alone, 8B shape, one decode row, 2 threads, builds alternated three times): bf16
// 24.7 -> 30.1-31.0 GB/s at 16384 keys, 28.8-29.5 -> 32.7-33.8 at 4096; fp8 +1-3%.
#include "tile_prefetch.inc"

template <typename T>
using Prefetch = TilePrefetch<T, _MM_HINT_T1>;

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

// The bf16 rows of the tile's keys (past n: a zero row): the cache's own rows, or FP8 rows
// widened once into it.k16.
void key_rows(const AttnArgs&, Item&, const uint16_t* k, const int64_t off[kKeyTile],
              int64_t n, const uint16_t* kr[kKeyTile]) {
  for (int64_t jj = 0; jj < kKeyTile; ++jj) kr[jj] = jj < n ? k + off[jj] : kZeroRow;
}
void key_rows(const AttnArgs& a, Item& it, const uint8_t* k, const int64_t off[kKeyTile],
              int64_t n, const uint16_t* kr[kKeyTile]) {
  for (int64_t jj = 0; jj < kKeyTile; ++jj) {
    if (jj >= n) {
      kr[jj] = kZeroRow;
      continue;
    }
    for (int64_t c = 0; c < a.d; c += 32) {
      _mm512_store_si512(it.k16[jj] + c, (__m512i)load_k32(k + off[jj] + c));
    }
    kr[jj] = it.k16[jj];
  }
}

// s[g][jj] = scale * (q[g] . K[jj]) for jj < n (lanes >= n hold 0): bf16 pairs
// multiplied into fp32 sums by dpbf16 (q and K bf16), then one 16-lane tree. FP8
// (scaled): the dot is scaled by ks' first.
template <typename T>
void scores(const AttnArgs& a, Item& it, int64_t g_n, const uint16_t* const kr[kKeyTile],
            bool scaled, const uint16_t* q, Prefetch<T>& pf) {
  // g_n + 2 slices of the next tile's keys: one after each head's scores, the rest spread
  // over accumulate_v's column chunks
  const int64_t slice = (pf.n + g_n + 1) / (g_n + 2);
  const __m512 scale = _mm512_set1_ps(a.scale);
  const __m512 ks = scaled ? _mm512_loadu_ps(it.ks) : _mm512_setzero_ps();
  for (int64_t g = 0; g < g_n; ++g) {
    const uint16_t* qg = q + g * a.q_sh;
    __m512 dot[kKeyTile];
    for (int jj = 0; jj < kKeyTile; ++jj) dot[jj] = _mm512_setzero_ps();
    for (int64_t c = 0; c < a.d; c += 32) {
      const __m512bh qc = (__m512bh)_mm512_loadu_si512(qg + c);
      for (int jj = 0; jj < kKeyTile; ++jj) {
        dot[jj] = _mm512_dpbf16_ps(dot[jj], qc, load_k32(kr[jj] + c));
      }
    }
    const __m512 sum = reduce16(dot);
    _mm512_storeu_ps(it.s[g], _mm512_mul_ps(scaled ? _mm512_mul_ps(sum, ks) : sum, scale));
    pf.keys(slice);
  }
}

// Online-softmax update of one tile: rescale acc, turn s into p (masked lanes 0); FP8
// (vs set): into p * vs', l summing p.
void softmax_tile(Item& it, int64_t g_n, int64_t n, int64_t d, bool vs) {
  const __mmask16 valid = static_cast<__mmask16>((1u << n) - 1u);
  const __m512 ninf = _mm512_set1_ps(-__builtin_inff());
  for (int64_t g = 0; g < g_n; ++g) {
    const __m512 sv = _mm512_mask_loadu_ps(ninf, valid, it.s[g]);
    const float m_new = __builtin_fmaxf(it.m[g], _mm512_reduce_max_ps(sv));
    const __m512 p = _mm512_maskz_mov_ps(valid, exp_ps(_mm512_sub_ps(sv, _mm512_set1_ps(m_new))));
    _mm512_storeu_ps(it.s[g], vs ? _mm512_mul_ps(p, _mm512_loadu_ps(it.vs)) : p);
    if (m_new == it.m[g]) {  // alpha = exp(0) = 1 exactly: l * 1 and acc * 1 change nothing
      it.l[g] += _mm512_reduce_add_ps(p);
      continue;
    }
    const __m512 alpha = exp_ps(_mm512_set1_ps(it.m[g] - m_new));
    it.l[g] = it.l[g] * _mm512_cvtss_f32(alpha) + _mm512_reduce_add_ps(p);
    it.m[g] = m_new;
    for (int64_t c = 0; c < d; c += 16) {
      _mm512_storeu_ps(it.acc[g] + c, _mm512_mul_ps(_mm512_loadu_ps(it.acc[g] + c), alpha));
    }
  }
}

// acc[g] += sum_jj p[g][jj] V[jj] for G heads and NC 16-wide column chunks at a time:
// compile-time bounds keep the G x NC accumulators in registers (independent fma chains).
template <int G, int NC, typename T>
void accumulate_v_fixed(const AttnArgs& a, Item& it, const T* v, const int64_t off[kKeyTile],
                        int64_t n, Prefetch<T>& pf) {
  const int64_t chunks = a.d / (16 * NC);  // the keys scores left, one slice per chunk
  const int64_t pv_slice = (pf.n - pf.done + chunks - 1) / chunks;
  for (int64_t c0 = 0; c0 < a.d; c0 += 16 * NC) {
    __m512 acc[G][NC];
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < NC; ++c) acc[g][c] = _mm512_loadu_ps(it.acc[g] + c0 + 16 * c);
    for (int64_t jj = 0; jj < n; ++jj) {
      const T* vr = v + off[jj] + c0;
      __m512 vc[NC];
      for (int c = 0; c < NC; ++c) vc[c] = load_v16(vr + 16 * c);
      for (int g = 0; g < G; ++g) {
        const __m512 pg = _mm512_set1_ps(it.s[g][jj]);
        for (int c = 0; c < NC; ++c) acc[g][c] = _mm512_fmadd_ps(pg, vc[c], acc[g][c]);
      }
    }
    for (int g = 0; g < G; ++g)
      for (int c = 0; c < NC; ++c) _mm512_storeu_ps(it.acc[g] + c0 + 16 * c, acc[g][c]);
    pf.keys(pv_slice);
  }
}

// The same sums for any G (accumulators in memory): the same fma per element in the same
// key order, so the same bits.
template <typename T>
void accumulate_v_any(const AttnArgs& a, Item& it, int64_t g_n, const T* v,
                      const int64_t off[kKeyTile], int64_t n, Prefetch<T>&) {
  for (int64_t c = 0; c < a.d; c += 16) {
    for (int64_t g = 0; g < g_n; ++g) {
      __m512 acc = _mm512_loadu_ps(it.acc[g] + c);
      for (int64_t jj = 0; jj < n; ++jj) {
        acc = _mm512_fmadd_ps(_mm512_set1_ps(it.s[g][jj]), load_v16(v + off[jj] + c), acc);
      }
      _mm512_storeu_ps(it.acc[g] + c, acc);
    }
  }
}

// d is a multiple of 32: two chunks always divide it; four when d % 64 == 0.
template <int G, typename T>
void accumulate_v_g(const AttnArgs& a, Item& it, const T* v, const int64_t off[kKeyTile],
                    int64_t n, Prefetch<T>& pf) {
  if (G <= 4 && a.d % 64 == 0) {
    accumulate_v_fixed<G, 4>(a, it, v, off, n, pf);
  } else {
    accumulate_v_fixed<G, 2>(a, it, v, off, n, pf);
  }
}

template <typename T>
void accumulate_v(const AttnArgs& a, Item& it, int64_t g_n, const T* v,
                  const int64_t off[kKeyTile], int64_t n, Prefetch<T>& pf) {
  switch (g_n) {
    case 1: accumulate_v_g<1>(a, it, v, off, n, pf); break;
    case 2: accumulate_v_g<2>(a, it, v, off, n, pf); break;
    case 3: accumulate_v_g<3>(a, it, v, off, n, pf); break;
    case 4: accumulate_v_g<4>(a, it, v, off, n, pf); break;
    case 5: accumulate_v_g<5>(a, it, v, off, n, pf); break;
    case 6: accumulate_v_g<6>(a, it, v, off, n, pf); break;
    case 8: accumulate_v_g<8>(a, it, v, off, n, pf); break;
    default: accumulate_v_any(a, it, g_n, v, off, n, pf); break;
  }
}

// One segment [j0, j1) of row (t, h) from scratch into it (acc unnormalized); k, v the
// bf16 caches or the e4m3 ones.
template <typename T>
void segment_typed(const AttnArgs& a, Item& it, int64_t t, int64_t h, int64_t j0,
                   int64_t j1, const T* k, const T* v) {
  constexpr bool kFp8 = sizeof(T) == 1;
  const int64_t g_n = a.hq / a.hkv;
  const int32_t* bt = a.block_tables + int64_t(a.token_seq[t]) * a.bt_stride;
  const uint16_t* q = a.q + t * a.q_st + h * g_n * a.q_sh;
  for (int64_t g = 0; g < g_n; ++g) {
    for (int64_t c = 0; c < a.d; c += 16) _mm512_storeu_ps(it.acc[g] + c, _mm512_setzero_ps());
    it.m[g] = -__builtin_inff();
    it.l[g] = 0.0f;
  }
  int64_t cur[kKeyTile], next[kKeyTile];
  int64_t n = j1 - j0 < kKeyTile ? j1 - j0 : kKeyTile;
  tile_offsets(a, bt, h, j0, n, cur);
  const int64_t len = a.ctx_lens[t];  // the row's keys: the prefetch may run past j1
  for (int64_t j = j0; j < j1; j += kKeyTile) {
    const int64_t j_next = j + kKeyTile;
    const int64_t n_next = j_next >= j1 ? 0 : (j1 - j_next < kKeyTile ? j1 - j_next : kKeyTile);
    // the prefetch runs on past the segment into the row's next keys: the next segment's
    // first tile, usually this thread's next item (measured: +11-17% fp8 at 16384 keys,
    // one decode row, 2 threads; bf16 +3-7%, within the noise)
    const int64_t n_pf = j_next >= len ? 0 : (len - j_next < kKeyTile ? len - j_next : kKeyTile);
    if (n_pf > 0) tile_offsets(a, bt, h, j_next, n_pf, next);
    Prefetch<T> pf{k, v, a.d, next, n_pf, 0};
    if (kFp8) tile_scales(a, it, cur, n);
    const uint16_t* kr[kKeyTile];
    key_rows(a, it, k, cur, n, kr);
    scores(a, it, g_n, kr, kFp8, q, pf);
    softmax_tile(it, g_n, n, a.d, kFp8);
    accumulate_v(a, it, g_n, v, cur, n, pf);
    pf.keys(pf.n);  // whatever is left (accumulate_v_any prefetches none)
    for (int64_t jj = 0; jj < n_next; ++jj) cur[jj] = next[jj];
    n = n_next;
  }
}

struct Query {};  // the query rows are read as bf16 pairs where they are used
inline void load_query(const AttnArgs&, Query&, int64_t, int64_t) {}

void attend_segment(const AttnArgs& a, Item& it, const Query&, int64_t t, int64_t h,
                    int64_t j0, int64_t j1) {
  if (a.k8 != nullptr) {
    segment_typed(a, it, t, h, j0, j1, a.k8, a.v8);
  } else {
    segment_typed(a, it, t, h, j0, j1, a.k, a.v);
  }
}

// The fp32 vector of this ISA, for attention_walk.inc's merge.
struct Lanes {
  using V = __m512;
  static constexpr int64_t kN = 16;
  static V load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
  static V set1(float x) { return _mm512_set1_ps(x); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static void store_bf16(uint16_t* p, V v) { avx512::store_bf16(p, v); }
  static float exp1(float x) { return _mm512_cvtss_f32(exp_ps(_mm512_set1_ps(x))); }
};

}  // namespace

#include "attention_walk.inc"

}  // namespace avx512
}  // namespace fp8serve

ISA_END
