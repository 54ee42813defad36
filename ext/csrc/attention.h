// Plain-pointer interface of the paged-attention kernels, shared by the generic
// translation unit (attention.cpp: checks, threading, portable kernel) and the vector ones
// (attention_avx512.cpp, attention_avx2.cpp: each compiled for its ISA only, no torch or
// STL headers).
//
// A query row (token t) attends keys [0, ctx_len). Per KV head h, the G = Hq / Hkv query
// heads of h attend together, so each K/V row is read once for the group. The keys are cut
// into fixed segments of kSegment absolute positions ([0, 128), [128, 256), ...); inside a
// segment keys are visited in position order in tiles of kKeyTile with an fp32 online
// softmax started from scratch, giving (m_s, l_s, acc_s) = (max score, sum of
// exp(score - m_s), sum of exp(score - m_s) V) per query head. The segments are then
// merged left to right:
//   M = max(M, m_s);  L = L e^(M_old - M) + l_s e^(m_s - M);  A likewise;  out = bf16(A / L)
// (the first segment is taken as is, so a row with ctx_len <= kSegment is one plain online
// softmax). The arithmetic for a query row depends only on that row, its context length
// and the cache contents, never on the other rows in the call (batch composition, prefill
// chunking) nor on whether its segments ran on one thread or several.
#pragma once

#include <cstdint>

namespace at { class Tensor; }

namespace fp8serve {

constexpr int64_t kKeyTile = 16;      // keys per softmax tile (absolute positions j0 = 16i)
constexpr int64_t kSegment = 128;     // keys per segment, a multiple of kKeyTile
constexpr int64_t kMaxHeadDim = 256;  // head_dim: a multiple of 32, at most this
constexpr int64_t kMaxGroup = 16;     // query heads per KV head

// The paged K/V layout every kernel, write and fused op shares: a cache is
// [num_blocks, Hkv, block_size, D] contiguous (each KV head's rows of a block adjacent, so
// a head's keys come in runs of block_size rows), its fp8 scales [num_blocks, Hkv,
// block_size]. A slot is block * block_size + offset; row (slot, h) is
//   ((block * Hkv + h) * block_size + offset), at element row * D of the cache.
inline int64_t kv_row(int64_t slot, int64_t h, int64_t hkv, int64_t block_size) {
  const int64_t b = slot / block_size;
  return (b * hkv + h) * block_size + (slot - b * block_size);
}

struct AttnArgs {
  const uint16_t* q;       // bf16, q[t, hq, :] at q + t * q_st + hq * q_sh (unit stride)
  int64_t q_st, q_sh;
  const uint16_t* k;       // bf16 K cache [blocks, hkv, block_size, d] (kv_row above)
  const uint16_t* v;       // bf16 V cache, same layout
  int64_t hq, hkv, d, block_size;
  const int32_t* block_tables;  // [C, bt_stride] block ids
  int64_t bt_stride;
  const int32_t* token_seq;     // [T] row of block_tables for each query token
  const int32_t* ctx_lens;      // [T] keys attended by each token (its position + 1)
  float scale;                  // softmax scale, folded into the scores
  uint16_t* out;                // bf16, out[t, hq * d + i] at out + t * out_st + hq * d + i
  int64_t out_st;
  // FP8 KV (kv_fp8.cpp): when k8 is set, K/V are float8_e4m3fn [blocks, hkv, block_size,
  // d] (k, v are then unused) with fp32 dequant scales ks / vs [blocks, hkv, block_size]:
  //   K[slot, h, i] = ks[r] * e4m3(k8[r * d + i]), r = kv_row(slot, h), V likewise.
  // Every kernel reads this form, and so does the fused decode stack (decode_team.cpp).
  const uint8_t* k8 = nullptr;
  const uint8_t* v8 = nullptr;
  const float* ks = nullptr;
  const float* vs = nullptr;
};

// One (token, KV head) row x[d] bf16 -> q[d] e4m3 codes; returns its dequant scale
// (kv_write_fp8's rule: `fixed` if > 0, else amax / 448, 1 when amax < 1e-30). kv_fp8.cpp;
// the team decode path (decode_team.cpp) writes its K/V rows through it too.
float quantize_kv_row(const uint16_t* x, int64_t d, float fixed, uint8_t* q);
// Row (slot, h) of K (value = false) or V as fp32 into out[d]; returns its dequant scale
// (1 for bf16 caches, so scaling by it changes no bf16 result). kv_fp8.cpp.
float load_kv_row(const AttnArgs& a, bool value, int64_t slot, int64_t h, float* out);
// Points a at float8_e4m3fn caches [blocks, Hkv, bs, D] and their fp32 scales [blocks,
// Hkv, bs] after
// checking those shapes and dtypes (TORCH_CHECK). kv_fp8.cpp.
void attach_fp8_kv(AttnArgs& a, const at::Tensor& k_cache, const at::Tensor& v_cache,
                   const at::Tensor& k_scale, const at::Tensor& v_scale);

// Torch-side argument check (attention.cpp; TORCH_CHECK on failure): every block id of
// block_tables [c_n, bt_stride] lies in [0, blocks), and each of the t_n tokens has
// token_seq in [0, c_n) and ctx_len in [1, bt_stride * block_size].
void check_paged_indices(const AttnArgs& a, int64_t t_n, int64_t c_n, int64_t blocks);

// TORCH_CHECK that c is a contiguous `dtype` cache [blocks, hkv, block_size, d] (`what`
// names it in the message) and s (when given) its contiguous fp32 scales [blocks, hkv,
// block_size]. attention.cpp; the writes, paged_attention and the fused decode ops share it.
void check_kv_cache(const at::Tensor& c, const char* what, int64_t blocks, int64_t hkv,
                    int64_t block_size, int64_t d, const at::Tensor* s);

// Segments of a context of ctx_len keys.
inline int64_t num_segments(int64_t ctx_len) { return (ctx_len + kSegment - 1) / kSegment; }

// fp32 floats of one segment's partial result: m [G], l [G], acc [G][d].
inline int64_t partial_floats(const AttnArgs& a) { return (a.hq / a.hkv) * (2 + a.d); }

namespace avx512 {
// Whole rows, one thread: items [i0, i1) of T * Hkv, item = t * hkv + h (every segment of
// the row, merged in order).
void attend_items(const AttnArgs& a, int64_t i0, int64_t i1);
// Split rows: items [i0, i1) of T * Hkv * nseg, item = (t * hkv + h) * nseg + s: segment s
// of row (t, h) -> part + item * partial_floats(a) (nothing when s >= the row's segments).
void attend_segments(const AttnArgs& a, int64_t nseg, int64_t i0, int64_t i1, float* part);
// Rows [i0, i1) of T * Hkv from their partials (as written by attend_segments) -> out.
void merge_segments(const AttnArgs& a, int64_t nseg, int64_t i0, int64_t i1,
                    const float* part);
}  // namespace avx512

// The same three entry points for AVX2 + FMA + F16C, reading bf16 caches or (k8 set) the
// FP8 form with K/V rows converted in registers (attention_avx2.cpp). Same segments, tiles
// and merge order, so the same invariance; its bits differ from the other kernels'.
namespace avx2 {
void attend_items(const AttnArgs& a, int64_t i0, int64_t i1);
void attend_segments(const AttnArgs& a, int64_t nseg, int64_t i0, int64_t i1, float* part);
void merge_segments(const AttnArgs& a, int64_t nseg, int64_t i0, int64_t i1,
                    const float* part);
}  // namespace avx2

// The vector kernels' three entry points, one set per ISA.
struct VectorKernel {
  void (*items)(const AttnArgs&, int64_t, int64_t);
  void (*segments)(const AttnArgs&, int64_t, int64_t, int64_t, float*);
  void (*merge)(const AttnArgs&, int64_t, int64_t, int64_t, const float*);
};

// The set paged_attention runs at the dispatch ISA (cpu_isa() >= kAvx2): AVX-512 from
// level avx512 on, else AVX2. The fused decode paths call the same one, so their attention
// rows are paged_attention's.
const VectorKernel& vector_kernel();

}  // namespace fp8serve
