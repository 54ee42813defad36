// One decode token through a stack of decoder layers inside ONE parallel region (the
// T == 1 path of decode_layer / decode_stack, decode_layer.cpp). Generic translation unit
// interface: plain pointers, already checked by the caller.
//
// Per layer the team of threads shares the work of each phase and meets at a spin
// barrier between phases (6 per layer) instead of forking a region per op:
//   x = rms_norm(h)              every thread, into its own buffer (same bits)
//   qkv = x @ Wqkv.T             32-column tiles claimed front/back | barrier
//   rope(q, k), K/V -> cache     thread 0                           | barrier
//   attention segments           (KV head, 128-key segment) items   | barrier
//   a = merge(segments)          every thread, into its own buffer
//   h[cols] += (a @ Wo.T)[cols]  per claimed tile                   | barrier
//   gu = rms_norm(h) @ Wgu.T     tiles                              | barrier
//   h[cols] += (silu(g) u @ Wdown.T)[cols]  (silu*mul per thread)   | barrier
// Every output element is computed by the same code whichever thread claims it, and the
// attention segments merge in a fixed order (attention.h), so the bits equal the
// per-op path's and do not depend on the thread count.
#pragma once

#include <cstdint>

#include "isa.h"

namespace fp8serve {

struct LinearRef {
  const uint8_t* w;    // vnni32 fp8 [Np/32][Kp/2][32][2]
  const float* scale;  // fp32 [N] (bk == 0) or [ceil(N/bn), ceil(K/bk)]
  int64_t n, kp, bn, bk, k_blocks;
};

struct LayerRef {
  const uint16_t* input_norm;  // bf16 [H]
  const uint16_t* post_norm;   // bf16 [H]
  LinearRef qkv, o, gu, down;  // K = H, Hq*D, H, I (each a multiple of 32)
  uint16_t* k_cache;           // bf16 [S, Hkv, D]
  uint16_t* v_cache;
};

struct TokenRef {
  int64_t hid, hq, hkv, d, inter, block_size;
  float eps;
  const float *cos, *sin, *q_cos, *q_sin;  // fp32 [D/2] rows of the token's position
  int64_t slot;                            // cache row of the token's K/V
  const int32_t* block_table;              // the token's block ids
  int64_t bt_stride;
  int32_t ctx_len;                         // position + 1
};

// h bf16 [H] in place through layers[0 .. n_layers) on up to `threads` threads (and no
// more than the CPUs the process may run on).
void decode_single(const TokenRef& tok, const LayerRef* layers, int64_t n_layers,
                   uint16_t* h, int64_t threads);

}  // namespace fp8serve
