// Paged attention and the KV-cache write (layouts in ops.h, algorithm in attention.h).
//
//   paged_attention: q [T, Hq, D] bf16 (unit stride on D), k_cache / v_cache
//       [num_blocks, Hkv, block_size, D] bf16 contiguous (attention.h kv_row), or
//       float8_e4m3fn with k_scale / v_scale [num_blocks, Hkv, block_size] fp32 (kv_fp8.cpp),
//       block_tables [C, W] int32, token_seq [T] int32 (row of block_tables),
//       ctx_lens [T] int32 (keys 0 .. ctx_len - 1 attended) -> out [T, Hq * D] bf16.
//   kv_write: k, v [T, Hkv, D] bf16 -> k_cache / v_cache rows slot_mapping [T] int64.
//
// Work items (token, KV head), or for a few rows their key segments, are split over
// torch's intra-op threads dynamically (tile_sched.h): a prefill chunk's items cost in
// proportion to their context length, so a static split of the causal triangle leaves one
// thread with most of the work. AVX-512 hosts run attention_avx512.cpp, AVX2 hosts
// attention_avx2.cpp (both read bf16 and FP8 caches), others the portable kernel below
// (same segments and tiles, std::exp).
#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "attention.h"
#include "isa.h"
#include "ops.h"
#include "tile_sched.h"

namespace fp8serve {
namespace {

float bf16_to_f32(uint16_t b) {
  uint32_t u = uint32_t(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_bf16(float f) {  // round to nearest even
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  return uint16_t((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}

int64_t key_slot(const AttnArgs& a, const int32_t* bt, int64_t j) {  // attention.h kv_row
  return int64_t(bt[j / a.block_size]) * a.block_size + j % a.block_size;
}

struct Partial {  // one segment (or the running merge) of one query head
  float m, l;
  std::vector<float> acc;
};

// Segment [j0, j1) of query head `head` (KV head h) of token t, from scratch.
void segment_portable(const AttnArgs& a, int64_t t, int64_t h, int64_t head, int64_t j0,
                      int64_t j1, Partial& p) {
  const int64_t d = a.d;
  const int32_t* bt = a.block_tables + int64_t(a.token_seq[t]) * a.bt_stride;
  const uint16_t* qr = a.q + t * a.q_st + head * a.q_sh;
  std::vector<float> qf(d), s(kKeyTile), row(d);
  for (int64_t i = 0; i < d; ++i) qf[i] = bf16_to_f32(qr[i]);
  p.acc.assign(d, 0.0f);
  p.m = -std::numeric_limits<float>::infinity();
  p.l = 0.0f;
  for (int64_t jt = j0; jt < j1; jt += kKeyTile) {
    const int64_t n = std::min(kKeyTile, j1 - jt);
    float m_new = p.m;
    for (int64_t jj = 0; jj < n; ++jj) {
      const float ks = load_kv_row(a, false, key_slot(a, bt, jt + jj), h, row.data());
      float dot = 0.0f;
      for (int64_t i = 0; i < d; ++i) dot += qf[i] * row[i];
      s[jj] = dot * ks * a.scale;  // ks = 1 (exact) for bf16 caches
      m_new = std::max(m_new, s[jj]);
    }
    const float alpha = std::exp(p.m - m_new);
    float sum = 0.0f;
    for (int64_t jj = 0; jj < n; ++jj) sum += (s[jj] = std::exp(s[jj] - m_new));
    p.l = p.l * alpha + sum;
    p.m = m_new;
    for (int64_t i = 0; i < d; ++i) p.acc[i] *= alpha;
    for (int64_t jj = 0; jj < n; ++jj) {
      const float w = s[jj] * load_kv_row(a, true, key_slot(a, bt, jt + jj), h, row.data());
      for (int64_t i = 0; i < d; ++i) p.acc[i] += w * row[i];
    }
  }
}

// Portable kernel: per query head, the segments and tiles of the AVX-512 one (attention.h).
void attend_portable(const AttnArgs& a, int64_t t, int64_t h) {
  const int64_t g_n = a.hq / a.hkv, d = a.d, len = a.ctx_lens[t];
  Partial run, seg;
  for (int64_t g = 0; g < g_n; ++g) {
    const int64_t head = h * g_n + g;
    segment_portable(a, t, h, head, 0, std::min(len, kSegment), run);
    for (int64_t j0 = kSegment; j0 < len; j0 += kSegment) {
      segment_portable(a, t, h, head, j0, std::min(len, j0 + kSegment), seg);
      const float m_new = std::max(run.m, seg.m);
      const float ea = std::exp(run.m - m_new), eb = std::exp(seg.m - m_new);
      run.l = run.l * ea + seg.l * eb;
      run.m = m_new;
      for (int64_t i = 0; i < d; ++i) run.acc[i] = run.acc[i] * ea + seg.acc[i] * eb;
    }
    uint16_t* o = a.out + t * a.out_st + head * d;
    for (int64_t i = 0; i < d; ++i) o[i] = f32_to_bf16(run.acc[i] / run.l);
  }
}

void check_int(const at::Tensor& t, const char* name, int64_t dim) {
  TORCH_CHECK(t.scalar_type() == at::kInt && t.dim() == dim && t.is_contiguous(),
              "paged_attention: ", name, " must be a contiguous ", dim, "-D int32 tensor, got ",
              t.scalar_type(), " ", t.sizes());
}

// Below this many (key, KV head) pairs in the call, attention runs on the calling thread.
constexpr int64_t kInlineKeys = 1024;

constexpr VectorKernel kAvx512Kernel{avx512::attend_items, avx512::attend_segments,
                                     avx512::merge_segments};
constexpr VectorKernel kAvx2Kernel{avx2::attend_items, avx2::attend_segments,
                                   avx2::merge_segments};

// Whole (token, KV head) rows spread over the threads; when there are too few rows to
// keep the threads busy (single-sequence decode), their key segments instead, then one
// merge pass. Both give the same bits (attention.h), whatever the thread count.
void attend_vector(const VectorKernel& kern, const AttnArgs& a, int64_t t_n) {
  const int64_t rows = t_n * a.hkv;
  const int64_t threads = at::in_parallel_region() ? 1 : at::get_num_threads();
  int64_t nseg = 1, keys = 0;
  for (int64_t t = 0; t < t_n; ++t) {
    nseg = std::max(nseg, num_segments(a.ctx_lens[t]));
    keys += a.ctx_lens[t];
  }
  if (threads <= 1 || keys * a.hkv < kInlineKeys) {  // a few us: not worth a fork
    kern.items(a, 0, rows);
    return;
  }
  if (nseg == 1 || rows >= 2 * threads) {
    parallel_tiles(rows, 1, [&](int64_t i0, int64_t i1) { kern.items(a, i0, i1); });
    return;
  }
  std::vector<float> part(size_t(rows * nseg * partial_floats(a)));
  parallel_tiles(rows * nseg, 1, [&](int64_t i0, int64_t i1) {
    kern.segments(a, nseg, i0, i1, part.data());
  });
  kern.merge(a, nseg, 0, rows, part.data());
}

}  // namespace

const VectorKernel& vector_kernel() {
  return cpu_isa() >= Isa::kAvx512 ? kAvx512Kernel : kAvx2Kernel;
}

void check_kv_cache(const at::Tensor& c, const char* what, int64_t blocks, int64_t hkv,
                    int64_t block_size, int64_t d, const at::Tensor* s) {
  TORCH_CHECK(c.dim() == 4 && c.is_contiguous() && c.size(0) == blocks && c.size(1) == hkv &&
                  c.size(2) == block_size && c.size(3) == d,
              what, " must be a contiguous cache [blocks=", blocks, ", Hkv=", hkv,
              ", block_size=", block_size, ", D=", d, "], got ", c.sizes());
  if (s == nullptr) return;
  TORCH_CHECK(s->scalar_type() == at::kFloat && s->dim() == 3 && s->is_contiguous() &&
                  s->size(0) == blocks && s->size(1) == hkv && s->size(2) == block_size,
              what, " scales must be contiguous fp32 [blocks=", blocks, ", Hkv=", hkv,
              ", block_size=", block_size, "], got ", s->scalar_type(), " ", s->sizes());
}

// Every index the kernel will follow stays inside the cache (attention.h).
void check_paged_indices(const AttnArgs& a, int64_t t_n, int64_t c_n, int64_t blocks) {
  for (int64_t i = 0; i < c_n * a.bt_stride; ++i) {
    TORCH_CHECK(a.block_tables[i] >= 0 && a.block_tables[i] < blocks,
                "paged_attention: block id ", a.block_tables[i], " outside [0, ", blocks, ")");
  }
  for (int64_t t = 0; t < t_n; ++t) {
    TORCH_CHECK(a.token_seq[t] >= 0 && a.token_seq[t] < c_n, "paged_attention: token_seq[",
                t, "] = ", a.token_seq[t], " outside [0, ", c_n, ")");
    TORCH_CHECK(a.ctx_lens[t] >= 1 && a.ctx_lens[t] <= a.bt_stride * a.block_size,
                "paged_attention: ctx_lens[", t, "] = ", a.ctx_lens[t], " outside [1, ",
                a.bt_stride * a.block_size, "]");
  }
}

// AVX-512 hosts: attention_avx512.cpp; AVX2 hosts: attention_avx2.cpp (both for bf16 and
// FP8 caches); below (or FP8SERVE_ISA=scalar): the portable kernel.
void paged_attention_into(const AttnArgs& a, int64_t t_n) {
  const Isa isa = cpu_isa();
  if (isa >= Isa::kAvx2) {
    attend_vector(vector_kernel(), a, t_n);
    return;
  }
  parallel_tiles(t_n * a.hkv, 1, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) attend_portable(a, i / a.hkv, i % a.hkv);
  });
}

at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const at::Tensor& block_tables,
                           const at::Tensor& token_seq, const at::Tensor& ctx_lens,
                           int64_t block_size, double scale,
                           const std::optional<at::Tensor>& k_scale,
                           const std::optional<at::Tensor>& v_scale) {
  TORCH_CHECK(q.scalar_type() == at::kBFloat16 && q.dim() == 3 && q.stride(2) == 1,
              "paged_attention: q must be bf16 [T, Hq, D] with unit stride on D, got ",
              q.scalar_type(), " ", q.sizes());
  TORCH_CHECK(k_cache.dim() == 4,
              "paged_attention: k_cache must be [blocks, Hkv, block_size, D], got ",
              k_cache.sizes());
  const int64_t t_n = q.size(0), hq = q.size(1), d = q.size(2), hkv = k_cache.size(1);
  const int64_t blocks = k_cache.size(0);
  TORCH_CHECK(d % 32 == 0 && d <= kMaxHeadDim, "paged_attention: head_dim ", d,
              " must be a multiple of 32 and <= ", kMaxHeadDim);
  TORCH_CHECK(hkv > 0 && hq % hkv == 0 && hq / hkv <= kMaxGroup, "paged_attention: Hq ", hq,
              " must be a multiple of Hkv ", hkv, " with at most ", kMaxGroup, " per group");
  const bool fp8 = k_cache.scalar_type() == at::kFloat8_e4m3fn;
  const at::ScalarType kv_dtype = fp8 ? at::kFloat8_e4m3fn : at::kBFloat16;
  TORCH_CHECK(k_cache.scalar_type() == kv_dtype && v_cache.scalar_type() == kv_dtype,
              "paged_attention: K/V caches must both be bf16 or both float8_e4m3fn, got ",
              k_cache.scalar_type(), " and ", v_cache.scalar_type());
  TORCH_CHECK(fp8 == (k_scale.has_value() && v_scale.has_value()) &&
                  k_scale.has_value() == v_scale.has_value(),
              "paged_attention: k_scale / v_scale are given exactly for fp8 caches");
  TORCH_CHECK(block_size > 0, "paged_attention: block_size must be positive");
  check_kv_cache(k_cache, "paged_attention: k_cache", blocks, hkv, block_size, d,
                 fp8 ? &*k_scale : nullptr);
  check_kv_cache(v_cache, "paged_attention: v_cache", blocks, hkv, block_size, d,
                 fp8 ? &*v_scale : nullptr);
  check_int(block_tables, "block_tables", 2);
  check_int(token_seq, "token_seq", 1);
  check_int(ctx_lens, "ctx_lens", 1);
  TORCH_CHECK(token_seq.size(0) == t_n && ctx_lens.size(0) == t_n,
              "paged_attention: token_seq and ctx_lens must be [T] = [", t_n, "]");
  at::Tensor out = at::empty({t_n, hq * d}, q.options().memory_format(at::MemoryFormat::Contiguous));
  AttnArgs a{reinterpret_cast<const uint16_t*>(q.data_ptr()), q.stride(0), q.stride(1),
             reinterpret_cast<const uint16_t*>(k_cache.data_ptr()),
             reinterpret_cast<const uint16_t*>(v_cache.data_ptr()), hq, hkv, d, block_size,
             block_tables.data_ptr<int32_t>(), block_tables.size(1), token_seq.data_ptr<int32_t>(),
             ctx_lens.data_ptr<int32_t>(), static_cast<float>(scale),
             reinterpret_cast<uint16_t*>(out.data_ptr()), hq * d};
  if (fp8) attach_fp8_kv(a, k_cache, v_cache, *k_scale, *v_scale);
  check_paged_indices(a, t_n, block_tables.size(0), blocks);
  if (t_n > 0) paged_attention_into(a, t_n);
  return out;
}

void kv_write(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k, const at::Tensor& v,
              const at::Tensor& slot_mapping) {
  const int64_t t_n = k.size(0);
  TORCH_CHECK(k_cache.scalar_type() == at::kBFloat16 && v_cache.scalar_type() == at::kBFloat16 &&
                  k_cache.dim() == 4,
              "kv_write: caches must be bf16 [blocks, Hkv, block_size, D], got ",
              k_cache.scalar_type(), " ", k_cache.sizes());
  const int64_t blocks = k_cache.size(0), hkv = k_cache.size(1), bs = k_cache.size(2);
  const int64_t d = k_cache.size(3), slots = blocks * bs;
  check_kv_cache(k_cache, "kv_write: k_cache", blocks, hkv, bs, d, nullptr);
  check_kv_cache(v_cache, "kv_write: v_cache", blocks, hkv, bs, d, nullptr);
  for (const at::Tensor* x : {&k, &v}) {
    TORCH_CHECK(x->scalar_type() == at::kBFloat16 && x->dim() == 3 && x->size(0) == t_n &&
                    x->size(1) == hkv && x->size(2) == d && x->stride(2) == 1 &&
                    x->stride(1) == d,
                "kv_write: k/v must be bf16 [T, Hkv=", hkv, ", D=", d,
                "] with contiguous rows, got ", x->sizes());
  }
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.dim() == 1 &&
                  slot_mapping.size(0) == t_n && slot_mapping.is_contiguous(),
              "kv_write: slot_mapping must be contiguous int64 [T] = [", t_n, "]");
  const int64_t* sm = slot_mapping.data_ptr<int64_t>();
  auto* kc = reinterpret_cast<uint16_t*>(k_cache.data_ptr());
  auto* vc = reinterpret_cast<uint16_t*>(v_cache.data_ptr());
  const auto* kp = reinterpret_cast<const uint16_t*>(k.data_ptr());
  const auto* vp = reinterpret_cast<const uint16_t*>(v.data_ptr());
  for (int64_t t = 0; t < t_n; ++t) {
    TORCH_CHECK(sm[t] >= 0 && sm[t] < slots, "kv_write: slot ", sm[t], " outside [0, ", slots, ")");
    for (int64_t h = 0; h < hkv; ++h) {
      const int64_t row = kv_row(sm[t], h, hkv, bs);
      std::memcpy(kc + row * d, kp + t * k.stride(0) + h * d, d * 2);
      std::memcpy(vc + row * d, vp + t * v.stride(0) + h * d, d * 2);
    }
  }
}

}  // namespace fp8serve
