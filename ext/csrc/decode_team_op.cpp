// Argument checks and refs for the team decode path (decode_team_op.h).
#include "decode_team_op.h"

#include <ATen/Parallel.h>

#include "attention.h"
#include "decode_team.h"
#include "isa.h"

namespace fp8serve {
namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A packed FP8 linear with K inputs (a multiple of 32) and N outputs, in the layout of
// its GEMM (decode_team.h LinearRef).
LinearRef linear_ref(const at::Tensor& w, const at::Tensor& scale, int64_t n, int64_t k,
                     int64_t bn, int64_t bk, GemmKind kind) {
  const bool avx2 = kind == GemmKind::kAvx2;
  const bool shape = avx2 ? w.dim() == 3 && w.size(0) == ceil_div(n, kTileN2) &&
                                w.size(1) == k && w.size(2) == kTileN2
                          : w.dim() == 4 && w.size(0) == ceil_div(n, kTileN) &&
                                w.size(1) == k / 2;
  TORCH_CHECK(w.scalar_type() == at::kFloat8_e4m3fn && w.is_contiguous() && shape &&
                  scale.scalar_type() == at::kFloat && scale.is_contiguous() &&
                  scale.numel() == (bk ? ceil_div(n, bn) * ceil_div(k, bk) : n) &&
                  (bk == 0 || (bn % kTileN == 0 && bk % kPadK == 0)),
              "decode_layer: packed weight / scale do not match N=", n, ", K=", k,
              avx2 ? " (avx2_16 [N/16, K, 16])" : " (vnni32)");
  return LinearRef{reinterpret_cast<const uint8_t*>(w.data_ptr()), scale.data_ptr<float>(),
                   n, k, bn, bk, bk ? ceil_div(k, bk) : 0, kind};
}

// A layer's K or V cache [blocks, Hkv, block_size, D] of `dtype` (and its fp32 scales
// [blocks, Hkv, block_size] when fp8), attention.h's layout.
void check_cache(const at::Tensor& c, const at::Tensor* scale, const StepRef& t,
                 int64_t blocks, at::ScalarType dtype) {
  TORCH_CHECK(c.scalar_type() == dtype, "decode_layer: K/V caches must be ", dtype, ", got ",
              c.scalar_type());
  check_kv_cache(c, "decode_layer: K/V cache", blocks, t.hkv, t.block_size, t.d, scale);
}

// Every index the step will follow stays inside the cache: the attention indices
// (attention.h check_paged_indices) and each token's K/V slot.
void check_index(const StepRef& t, const at::Tensor& bt, int64_t blocks) {
  const AttnArgs a{nullptr, 0, 0, nullptr, nullptr, t.hq, t.hkv, t.d, t.block_size,
                   t.block_tables, t.bt_stride, t.token_seq, t.ctx_lens, 0.0f, nullptr, 0};
  check_paged_indices(a, t.t_n, bt.size(0), blocks);
  const int64_t slots = blocks * t.block_size;
  for (int64_t r = 0; r < t.t_n; ++r) {
    TORCH_CHECK(t.slots[r] >= 0 && t.slots[r] < slots, "kv_write: slot ", t.slots[r],
                " outside [0, ", slots, ")");
  }
}

StepRef step_ref(const at::Tensor& h, c10::IntArrayRef dims, double eps, at::TensorList rope,
                 const at::Tensor& positions, const at::Tensor& slot_mapping,
                 at::TensorList index) {
  const int64_t t_n = h.size(0), hq = dims[0], hkv = dims[1], d = dims[2], bs = dims[4];
  TORCH_CHECK(t_n >= 1 && t_n <= kTeamMaxRows, "decode_layer: the team path takes 1 to ",
              kTeamMaxRows, " rows, got ", t_n);
  TORCH_CHECK(d % 32 == 0 && d <= kMaxHeadDim && hkv > 0 && hq % hkv == 0 &&
                  hq / hkv <= kMaxGroup && bs > 0,
              "decode_layer: head_dim ", d, " (a multiple of 32, <= ", kMaxHeadDim,
              "), Hq ", hq, " / Hkv ", hkv, " (<= ", kMaxGroup, " per group), block_size ", bs);
  TORCH_CHECK(slot_mapping.scalar_type() == at::kLong && slot_mapping.numel() == t_n &&
                  slot_mapping.is_contiguous(),
              "kv_write: slot_mapping must be contiguous int64 [T] = [", t_n, "]");
  const at::Tensor &bt = index[0], &seq = index[1], &ctx = index[2];
  TORCH_CHECK(bt.scalar_type() == at::kInt && bt.dim() == 2 && bt.is_contiguous() &&
                  seq.scalar_type() == at::kInt && seq.numel() == t_n && seq.is_contiguous() &&
                  ctx.scalar_type() == at::kInt && ctx.numel() == t_n && ctx.is_contiguous(),
              "decode_layer: block_tables [C, W], token_seq [T], ctx_lens [T] must be "
              "contiguous int32");
  return StepRef{t_n, h.size(1), hq, hkv, d, dims[3], bs, float(eps),
                 rope[0].data_ptr<float>(), rope[1].data_ptr<float>(),
                 rope[2].data_ptr<float>(), rope[3].data_ptr<float>(),
                 positions.data_ptr<int64_t>(), slot_mapping.data_ptr<int64_t>(),
                 bt.data_ptr<int32_t>(), bt.size(1), seq.data_ptr<int32_t>(),
                 ctx.data_ptr<int32_t>()};
}

}  // namespace

at::Tensor decode_team_op(const at::Tensor& h, const std::vector<at::TensorList>& weights,
                          const std::vector<c10::IntArrayRef>& dims, double eps,
                          at::TensorList rope_tables, const at::Tensor& positions,
                          const std::vector<at::Tensor>& k_caches,
                          const std::vector<at::Tensor>& v_caches,
                          const std::vector<Fp8KvScales>& fp8,
                          const at::Tensor& slot_mapping, at::TensorList index,
                          const uint8_t* generated) {
  StepRef tok = step_ref(h, dims[0], eps, rope_tables, positions, slot_mapping, index);
  tok.generated = generated;
  const int64_t blocks = k_caches[0].size(0);
  check_index(tok, index[0], blocks);
  std::vector<LayerRef> layers;
  for (size_t i = 0; i < weights.size(); ++i) {
    const at::TensorList w = weights[i];
    const c10::IntArrayRef dm = dims[i];
    TORCH_CHECK(dm.slice(0, 5).equals(dims[0].slice(0, 5)),
                "decode_layer: every layer needs the same heads, head_dim, I, block_size");
    TORCH_CHECK(fp8.empty() || fp8.size() == weights.size(),
                "decode_layer: fp8 scales for ", fp8.size(), " of ", weights.size(), " layers");
    const at::ScalarType kv_dtype = fp8.empty() ? at::kBFloat16 : at::kFloat8_e4m3fn;
    const Fp8KvScales* sc = fp8.empty() ? nullptr : &fp8[i];
    check_cache(k_caches[i], sc ? &sc->k_scale : nullptr, tok, blocks, kv_dtype);
    check_cache(v_caches[i], sc ? &sc->v_scale : nullptr, tok, blocks, kv_dtype);
    const int64_t hid = tok.hid, inter = tok.inter, qd = tok.hq * tok.d;
    const GemmKind kind = gemm_kind(dm[5]);
    TORCH_CHECK(cpu_isa() >= (kind == GemmKind::kAvx2 ? Isa::kAvx2 : Isa::kAvx512),
                "decode_layer: layer ", i, "'s GEMM (dims[5] = ", dm[5], ") needs ",
                kind == GemmKind::kAvx2 ? "AVX2" : "AVX-512", " (dispatch ISA is ",
                isa_name(cpu_isa()), ")");
    LayerRef ref{
        reinterpret_cast<const uint16_t*>(w[0].data_ptr()),
        reinterpret_cast<const uint16_t*>(w[1].data_ptr()),
        linear_ref(w[2], w[3], qd + 2 * tok.hkv * tok.d, hid, dm[6], dm[7], kind),
        linear_ref(w[4], w[5], hid, qd, dm[8], dm[9], kind),
        linear_ref(w[6], w[7], 2 * inter, hid, dm[10], dm[11], kind),
        linear_ref(w[8], w[9], hid, inter, dm[12], dm[13], kind),
        nullptr, nullptr};
    if (fp8.empty()) {
      ref.k_cache = reinterpret_cast<uint16_t*>(k_caches[i].data_ptr());
      ref.v_cache = reinterpret_cast<uint16_t*>(v_caches[i].data_ptr());
    } else {
      ref.k8 = reinterpret_cast<uint8_t*>(k_caches[i].data_ptr());
      ref.v8 = reinterpret_cast<uint8_t*>(v_caches[i].data_ptr());
      ref.ks = sc->k_scale.data_ptr<float>();
      ref.vs = sc->v_scale.data_ptr<float>();
      ref.k_static = float(sc->k_static);
      ref.v_static = float(sc->v_static);
    }
    layers.push_back(ref);
  }
  at::Tensor out = h.clone();
  decode_team(tok, layers.data(), int64_t(layers.size()),
              reinterpret_cast<uint16_t*>(out.data_ptr()), at::get_num_threads());
  return out;
}

}  // namespace fp8serve
