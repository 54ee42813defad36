// Batch-invariant linear layers for C++ callers (attention, fused decode layers, ops).
// Include from generic (torch-side) translation units; the kernels behind these calls
// live in the AVX-512 translation units (fp8_gemm_avx512*.cpp, bf16_gemm_avx512.cpp) and,
// for amx_linear, in amx_gemm_tiles.cpp (AMX) / amx_gemm_standin.cpp (portable).
//
// Batch invariance: output row i depends only on x row i and the weight, never on M, on
// the other rows, or on the thread count. Every output element is one fixed chain of
// _mm512_dpbf16_ps over the K pairs in increasing order (per k-block for block scales,
// each partial sum folded in with one fma), followed by one fixed epilogue. The small-M
// ("direct": FP8 -> BF16 in registers) and large-M ("panel": a K-chunk of the weight
// converted to BF16 once, then all rows) paths run the same chain, so the M at which
// they switch does not change any bit. Work is split over 32-column tiles, never over K.
//
// Requirements shared by every call (checked by the torch ops, NOT re-checked here):
//   * cpu_isa() >= Isa::kAvx512 (AVX-512 F/BW/VL/BF16); the call aborts otherwise.
//   * x is [M, ldx] bf16, row-major, ldx >= Kp = ceil32(K), and columns K .. Kp-1 hold
//     zeros (the weight's K padding is zero, but 0 * NaN garbage would be NaN).
//   * the weight is packed by pack_vnni32 (FP8) or pack_bf16_vnni32 (BF16), i.e.
//     [Np/32][Kp/2][32][2] with element [t][p][j][i] = w[32t + j][2p + i], zero padded.
//
// Threads: fp8_linear / bf16_linear hand out the tiles dynamically (tile_sched.h; inside
// an at::parallel_for body they run inline on the calling thread). The *_tiles variants
// compute only tiles [t0, t1) (columns [32 t0, min(32 t1, N))) on the calling thread.
#pragma once

#include <cstdint>

#include "isa.h"

namespace fp8serve {

// Below or at this M the FP8 linear converts the weight in registers; above, per panel.
constexpr int64_t kDirectMaxM = 4;

// FP8 W8A16: y[M, N] bf16 = bf16(sum_k x[m, k] * w[n, k] * scale + bias[n]).
//   a.w       vnni32 fp8 [Np/32][Kp/2][32][2]
//   a.scale   block_k == 0: fp32 [N] (per-tensor: expand to [N]);
//             else fp32 [ceil(N/block_n), ceil(K/block_k)], block_n % 32 == 0,
//             block_k % 32 == 0, a.k_blocks = ceil(K/block_k)
//   a.bias    fp32 [N] or nullptr;  a.y bf16 [M, ldy] (ldy == 0 means N)
// direct_max_m only picks the faster path; results are identical for any value.
void fp8_linear(const GemvArgs& a, int64_t direct_max_m = kDirectMaxM);
void fp8_linear_tiles(const GemvArgs& a, int64_t t0, int64_t t1,
                      int64_t direct_max_m = kDirectMaxM);

// The AMX tile GEMM (amx_gemm.inc) on the same arguments as fp8_linear: one TDPBF16PS
// walk over K per output for every M (batch-invariant, but not bitwise equal to
// fp8_linear). Real tiles when cpu_isa() == kAmx, else the portable stand-in (every host;
// slow: for tests). M <= kAmxRowTile: the decode walk (tiles of M rows); above, rows
// padded inside tiles of kAmxRowTile.
constexpr int64_t kAmxRowTile = 16;
void amx_linear(const GemvArgs& a);
void amx_linear_tiles(const GemvArgs& a, int64_t t0, int64_t t1);

// BF16 weights (e.g. the lm_head): y[M, N] = sum_k x[m, k] * w[n, k] + bias[n], fp32
// accumulation, output bf16 or fp32 (Bf16GemmArgs::y_fp32).
void bf16_linear(const Bf16GemmArgs& a);
void bf16_linear_tiles(const Bf16GemmArgs& a, int64_t t0, int64_t t1);

}  // namespace fp8serve
