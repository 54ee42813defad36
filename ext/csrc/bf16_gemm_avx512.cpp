// AVX-512 BF16 GEMM on a BF16 weight packed like the FP8 one (bf16 vnni32
// [Np/32][Kp/2][32][2]), e.g. the tied lm_head: y[M, N] = x[M, K] @ w[N, K].T + bias,
// fp32 accumulation, bf16 or fp32 output. Up to 32 rows each output's dpbf16 chain stays in
// registers over the whole K; above, the panel path of avx512_kernels.inc with the weight
// itself as the panel (no conversion). Both run one chain per output over the k-pairs in
// order, so row i never depends on M or on the other rows (gemm.h).
// Compiled for AVX-512 only (ISA_BEGIN); no torch or STL headers here.
#include <immintrin.h>

#include "isa.h"

ISA_BEGIN("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")

namespace fp8serve {
namespace avx512 {
namespace {

#include "avx512_kernels.inc"

struct WeightChunk {  // the chunk is the packed weight itself
  const uint16_t* w;  // tile 0 of the group, pair 0
  int64_t tstride;    // elements between tiles
  Bf16Src operator()(int64_t p0, int64_t) const { return Bf16Src{w + 64 * p0, tstride}; }
};

template <int NT>
void bf16_group(const Bf16GemmArgs& a, const OutSpec& o, int64_t r0, int64_t rows,
                int64_t t, Scratch& s) {
  const int64_t pairs = a.kp / 2;
  const WeightChunk chunk{a.w + t * pairs * 64, pairs * 64};
  panel_block<NT>(a.x + r0 * a.ldx, a.ldx, rows, pairs, pairs, false, chunk, nullptr, 0, s);
  store_block<NT>(o, r0, rows, t, s.c);
}

// Few rows: each output's chain stays in registers over the whole K (MR rows x NT tiles),
// the weight read straight from the packed copy in one pass per row group; the same chain
// as the panel path, so the same bits (avx512_kernels.inc).
template <int MR, int NT>
void bf16_direct_group(const Bf16GemmArgs& a, const OutSpec& o, int64_t m0, int64_t t) {
  const int64_t pairs = a.kp / 2;
  __m512 acc[MR][2 * NT];
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < 2 * NT; ++c) acc[r][c] = _mm512_setzero_ps();
  chain<MR, NT>(a.x + m0 * a.ldx, a.ldx, Bf16Src{a.w + t * pairs * 64, pairs * 64}, pairs, acc);
  for (int r = 0; r < MR; ++r)
    for (int c = 0; c < 2 * NT; ++c)
      if (t * kTileN + 16 * c < a.n) store16(o, m0 + r, t * kTileN + 16 * c, acc[r][c]);
}

template <int NT>
void bf16_direct_rows(const Bf16GemmArgs& a, const OutSpec& o, int64_t t, int64_t m0) {
  for (; m0 < a.m; m0 += 4) {
    switch (min64(4, a.m - m0)) {
      case 1: bf16_direct_group<1, NT>(a, o, m0, t); break;
      case 2: bf16_direct_group<2, NT>(a, o, m0, t); break;
      case 3: bf16_direct_group<3, NT>(a, o, m0, t); break;
      default: bf16_direct_group<4, NT>(a, o, m0, t); break;
    }
  }
}

// Up to this M the direct path runs: 5-20% faster than the panel path's 64-pair chunks
// (whose fp32 sums go to memory and back per chunk) for the 49k x 576 lm_head at M = 1-16.
constexpr int64_t kBf16DirectMaxM = 32;

// M <= kBf16DirectMaxM: one row runs 4 tiles at a time (8 independent chains, the weight
// streaming from DRAM); 2-7 rows pair tiles in 4-row groups; from 8 rows, single tiles in
// 8-row groups (the tile stays in cache for the next group).
void bf16_direct_tiles(const Bf16GemmArgs& a, const OutSpec& o, int64_t t0, int64_t t1) {
  int64_t t = t0;
  if (a.m == 1) {
    for (; t + 4 <= t1; t += 4) bf16_direct_group<1, 4>(a, o, 0, t);
  } else if (a.m >= 8) {
    for (; t < t1; ++t) {
      int64_t m0 = 0;
      for (; m0 + 8 <= a.m; m0 += 8) bf16_direct_group<8, 1>(a, o, m0, t);
      bf16_direct_rows<1>(a, o, t, m0);
    }
  } else {
    for (; t + 2 <= t1; t += 2) bf16_direct_rows<2>(a, o, t, 0);
  }
  for (; t < t1; ++t) bf16_direct_rows<1>(a, o, t, 0);
}

}  // namespace

void bf16_tiles(const Bf16GemmArgs& a, int64_t t0, int64_t t1) {
  const OutSpec o{a.y, a.ldy ? a.ldy : a.n, a.n, a.y_fp32, nullptr, 1.0f, a.bias};
  if (a.m <= kBf16DirectMaxM) {
    bf16_direct_tiles(a, o, t0, t1);
    return;
  }
  Scratch& s = thread_scratch();
  for (int64_t r0 = 0; r0 < a.m; r0 += kMc) {
    const int64_t rows = min64(kMc, a.m - r0);
    int64_t t = t0;
    for (; t + 2 <= t1; t += 2) bf16_group<2>(a, o, r0, rows, t, s);
    if (t < t1) bf16_group<1>(a, o, r0, rows, t, s);
  }
}

}  // namespace avx512
}  // namespace fp8serve

ISA_END
