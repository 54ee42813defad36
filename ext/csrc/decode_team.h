// A step of up to kTeamMaxRows token rows (a decode batch, or a short prefill chunk)
// through a stack of decoder layers inside ONE parallel region: the small-T path of
// decode_stack (and of decode_layer for T == 1), decode_layer.cpp. Generic translation
// unit interface: plain pointers, already checked by the caller (decode_team_op.cpp).
//
// Per layer the team of threads shares the work of each phase and meets at a spin
// barrier between phases (6 per layer) instead of forking a region per op:
//   x = rms_norm(h)              every thread, all rows, into its own buffer (same bits)
//   qkv = x @ Wqkv.T             column tiles (32, AVX2: 16), a contiguous  | barrier
//                                part per thread claimed from its front, then the
//                                others' backs (AVX2: x widened to fp32 per thread first)
//   rope(q, k), K/V -> cache     rows split over the threads (fp8 caches:   | barrier
//                                each (row, KV head) quantized as kv_write_fp8 does)
//   attention                    (row, KV head) items, or with few rows     | barrier
//                                (row, KV head, 128-key segment) items merged by every
//                                thread into its own buffer
//   h[:, cols] += (a @ Wo.T)[:, cols]  per claimed tile                     | barrier
//   gu = rms_norm(h) @ Wgu.T     tiles                                      | barrier
//   h[:, cols] += (silu(g) u @ Wdown.T)[:, cols]  (silu*mul per thread)     | barrier
// Every output element is computed by the same code whichever thread claims it, the GEMMs
// (the AVX-512, AMX or AVX2 one, as the layer's kernels report) are batch-invariant
// (gemm.h, avx2_gemm.inc) and attention rows do not depend on the other rows or on the
// segment split (attention.h), so the bits equal the per-op path's and do not depend on
// the thread count. The elementwise ops and attention are the dispatch ISA's (row_ops(),
// vector_kernel()), as on the per-op path.
#pragma once

#include <cstdint>

#include "isa.h"

namespace fp8serve {

// Rows up to which decode_stack runs the team path: the direct (in-register) GEMM range,
// where a step is short enough (a few ms) that a fork and join per op is a visible share.
constexpr int64_t kTeamMaxRows = 32;

// Which FP8 GEMM a layer's linears run: the one its kernels report. decode_layer's dims[5]
// says it: >= 0 the AVX-512 GEMM (avx512_w8a16 / avx512_block_w8a16, with that
// direct_max_m), kDimsAmx the AMX tile GEMM (amx_w8a16 / amx_block_w8a16), kDimsAvx2 the
// AVX2 GEMM (avx2_w8a16 / avx2_block_w8a16).
enum class GemmKind : int { kAvx512, kAmx, kAvx2 };
constexpr int64_t kDimsAmx = -1;
constexpr int64_t kDimsAvx2 = -2;
inline GemmKind gemm_kind(int64_t dim5) {
  return dim5 >= 0 ? GemmKind::kAvx512 : dim5 == kDimsAmx ? GemmKind::kAmx : GemmKind::kAvx2;
}

struct LinearRef {
  // kAvx512 / kAmx: vnni32 fp8 [Np/32][Kp/2][32][2] (isa.h), kp = Kp;
  // kAvx2: avx2_16 fp8 [Np/16][K][16] (isa.h), kp = K; block scales scale x per column
  // block first (decode_team.cpp gemm_tiles, as the op gemm_avx2 does)
  const uint8_t* w;
  const float* scale;  // fp32 [N] (bk == 0) or [ceil(N/bn), ceil(K/bk)]
  int64_t n, kp, bn, bk, k_blocks;
  GemmKind kind = GemmKind::kAvx512;
};

struct LayerRef {
  const uint16_t* input_norm;  // bf16 [H]
  const uint16_t* post_norm;   // bf16 [H]
  LinearRef qkv, o, gu, down;  // K = H, Hq*D, H, I (each a multiple of 32)
  uint16_t* k_cache;           // bf16 [blocks, Hkv, bs, D] (null for an fp8 cache)
  uint16_t* v_cache;
  // FP8 KV (attention.h AttnArgs k8): float8_e4m3fn [blocks, Hkv, bs, D] codes and fp32
  // [blocks, Hkv, bs] dequant scales, written through quantize_kv_row with the static
  // scales (0 = per row).
  uint8_t* k8 = nullptr;
  uint8_t* v8 = nullptr;
  float* ks = nullptr;
  float* vs = nullptr;
  float k_static = 0.0f, v_static = 0.0f;
};

struct StepRef {
  int64_t t_n;  // token rows, 1 .. kTeamMaxRows
  int64_t hid, hq, hkv, d, inter, block_size;
  float eps;
  const float *cos, *sin, *q_cos, *q_sin;  // fp32 [P, D/2] rope tables
  const int64_t* positions;                // [T] each token's position (< P)
  const int64_t* slots;                    // [T] cache row of each token's K/V
  const int32_t* block_tables;             // [C, bt_stride] block ids
  int64_t bt_stride;
  const int32_t* token_seq;                // [T] row of block_tables of each token
  const int32_t* ctx_lens;                 // [T] keys each token attends (position + 1)
  // [T] 1 = a generated row (decode, a draft, a recomputed output token): its linears run
  // the AVX-512 GEMM on the same vnni32 weight; 0 = a prompt row, on the layer's GEMM.
  // Only with layers on the AMX GEMM; null = every row on the layer's GEMM.
  const uint8_t* generated = nullptr;
};

// fn(r0, r1, generated) over the maximal runs of rows [0, rows) with the same role
// (StepRef::generated; null: one run of prompt rows). Each kernel is batch-invariant, so
// a row's bits depend on its role only, not on the runs around it.
template <class F>
void for_row_runs(const uint8_t* generated, int64_t rows, const F& fn) {
  for (int64_t r0 = 0, r1 = 0; r0 < rows; r0 = r1) {
    const bool g = generated != nullptr && generated[r0] != 0;
    for (r1 = r0 + 1; r1 < rows && (generated != nullptr && generated[r1] != 0) == g;) ++r1;
    fn(r0, r1, g);
  }
}

// h bf16 [T, H] in place through layers[0 .. n_layers) on up to `threads` threads (and no
// more than the CPUs the process may run on). Every token's K/V row is written before any
// token of the step attends, so a prefill chunk's tokens see each other (causal by
// ctx_lens).
void decode_team(const StepRef& step, const LayerRef* layers, int64_t n_layers, uint16_t* h,
                 int64_t threads);

}  // namespace fp8serve
