// Plain-pointer interface of the paged-attention kernels, shared by the generic
// translation unit (attention.cpp: checks, threading, portable kernel) and the AVX-512 one
// (attention_avx512.cpp, compiled for its ISA only, no torch or STL headers).
//
// One work item = (query token t, KV head h): the G = Hq / Hkv query heads of h attend
// together, so each K/V row is read once per item. Keys are visited in position order in
// tiles of kKeyTile starting at position 0, with an fp32 online softmax; the arithmetic
// for a query row depends only on that row, its context length and the cache contents,
// never on the other rows in the call (batch composition, prefill chunking).
#pragma once

#include <cstdint>

namespace fp8serve {

constexpr int64_t kKeyTile = 16;     // keys per softmax tile (absolute positions j0 = 16i)
constexpr int64_t kMaxHeadDim = 256;  // head_dim: a multiple of 32, at most this
constexpr int64_t kMaxGroup = 16;     // query heads per KV head

struct AttnArgs {
  const uint16_t* q;       // bf16, q[t, hq, :] at q + t * q_st + hq * q_sh (unit stride)
  int64_t q_st, q_sh;
  const uint16_t* k;       // bf16 K cache [slots, hkv, d] contiguous (slot = block * bs + off)
  const uint16_t* v;       // bf16 V cache, same layout
  int64_t hq, hkv, d, block_size;
  const int32_t* block_tables;  // [C, bt_stride] block ids
  int64_t bt_stride;
  const int32_t* token_seq;     // [T] row of block_tables for each query token
  const int32_t* ctx_lens;      // [T] keys attended by each token (its position + 1)
  float scale;                  // softmax scale, folded into q
  uint16_t* out;                // bf16, out[t, hq * d + i] at out + t * out_st + hq * d + i
  int64_t out_st;
};

namespace avx512 {
// Items [i0, i1) of T * Hkv, item = t * hkv + h.
void attend_items(const AttnArgs& a, int64_t i0, int64_t i1);
}  // namespace avx512

}  // namespace fp8serve
