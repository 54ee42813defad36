// AVX-512 BF16 GEMM on a BF16 weight packed like the FP8 one (bf16 vnni32
// [Np/32][Kp/2][32][2]), e.g. the tied lm_head: y[M, N] = x[M, K] @ w[N, K].T + bias,
// fp32 accumulation, bf16 or fp32 output. The panel path of avx512_kernels.inc with the
// weight itself as the panel (no conversion): each output is one dpbf16 chain over the
// k-pairs in order, so row i never depends on M or on the other rows (gemm.h).
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

}  // namespace

void bf16_tiles(const Bf16GemmArgs& a, int64_t t0, int64_t t1) {
  const OutSpec o{a.y, a.ldy ? a.ldy : a.n, a.n, a.y_fp32, nullptr, 1.0f, a.bias};
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
