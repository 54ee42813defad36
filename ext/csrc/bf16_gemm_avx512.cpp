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
  zero_group<MR, NT>(acc);
  chain<MR, NT>(a.x + m0 * a.ldx, a.ldx, Bf16Src{a.w + t * pairs * 64, pairs * 64}, pairs, acc);
  store_group<MR, NT>(o, m0, t, acc);
}

struct Bf16DirectGroup {
  const Bf16GemmArgs& a;
  const OutSpec& o;
  template <int MR, int NT>
  void run(int64_t m0, int64_t t) const { bf16_direct_group<MR, NT>(a, o, m0, t); }
};

// Up to this M the direct path runs (row groups as for FP8: avx512_kernels.inc
// group_tiles): 5-20% faster than the panel path's 64-pair chunks (whose fp32 sums go to
// memory and back per chunk) for the 49k x 576 lm_head at M = 1-16.
constexpr int64_t kBf16DirectMaxM = 32;

}  // namespace

void bf16_tiles(const Bf16GemmArgs& a, int64_t t0, int64_t t1) {
  const OutSpec o{a.y, a.ldy ? a.ldy : a.n, a.n, a.y_fp32, nullptr, 1.0f, a.bias};
  if (a.m <= kBf16DirectMaxM) {
    group_tiles(Bf16DirectGroup{a, o}, a.m, t0, t1);
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
