// One decoder layer in one op (the fused path of engine/model/decode_step.py):
//
//   x  = rms_norm(h, input_norm)                    fp32 math, bf16 out, times weight
//   qkv = x @ Wqkv.T                                FP8 GEMM (gemm.h fp8_linear or
//                                                   amx_linear, or gemm_avx2; see dims)
//   q, k = rope(q, k) at positions                  half-split, fp32, Llama-4 q scale in
//                                                   the q tables; bf16 out
//   cache[slot_mapping] = k, v;  a = paged_attention(q, cache)
//   h = h + a @ Wo.T
//   g, u = rms_norm(h, post_norm) @ Wgu.T;  h = h + bf16(bf16(silu(g)) * u) @ Wdown.T
//
// Tensors (T tokens, H hidden, I intermediate, D head_dim, P rope positions):
//   h [T, H] bf16 -> new h [T, H] bf16 (the input is not modified)
//   weights = [input_norm [H] bf16, post_norm [H] bf16, qkv_w, qkv_scale, o_w, o_scale,
//              gu_w, gu_scale, down_w, down_scale]  (each *_w and *_scale as for the GEMM
//              dims[5] names: vnni32 fp8 for gemm_avx512 / gemm_amx, avx2_16 fp8 for
//              gemm_avx2; scales fp32 [N], or [ceil(N/bn), ceil(K/bk)] with bk > 0)
//   dims = [Hq, Hkv, D, I, block_size, gemm, qkv_bn, qkv_bk, o_bn, o_bk, gu_bn,
//           gu_bk, down_bn, down_bk];  gemm >= 0: the AVX-512 GEMM (gemm_avx512) with
//           gemv_max_m = gemm; gemm = -1: the AMX tile GEMM (gemm_amx); gemm = -2: the
//           AVX2 GEMM (gemm_avx2); whichever the layer's kernels report (decode_team.h
//           GemmKind). The norms, RoPE, SwiGLU, adds and attention run at the dispatch
//           ISA (AVX-512, else AVX2: row_ops(), paged_attention).
//   rope = [cos, sin, q_cos, q_sin] fp32 [P, D/2] contiguous;  positions [T] int64
//   k_cache / v_cache [blocks, Hkv, bs, D] bf16 (written), slot_mapping [T] int64, block_tables,
//   token_seq, ctx_lens as for paged_attention; or an fp8 cache: k_cache / v_cache
//   float8_e4m3fn [blocks, Hkv, bs, D] with k_scale / v_scale fp32 [blocks, Hkv, bs] and
//   the static scales (0 = per row), written as kv_write_fp8 writes and read as
//   paged_attention reads them.
//   generated_rows: none, or uint8 / bool [T] for layers on the AMX GEMM: a row marked 1
//   (a generated token) runs every linear on the AVX-512 GEMM over the same vnni32 weight,
//   a row marked 0 (a prompt token) on the tiles (decode_team.h StepRef::generated).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

#include "decode_layer.h"
#include "decode_team_op.h"
#include "decode_team.h"
#include "gemm.h"
#include "isa.h"
#include "ops.h"

namespace fp8serve {

namespace {

uint16_t* bits(const at::Tensor& t) { return reinterpret_cast<uint16_t*>(t.data_ptr()); }

// fn(t0, t1) over row ranges covering [0, t_n), split over torch's threads in ranges of at
// least ~32K elements (a prefill chunk's rows in parallel; a few decode rows stay on the
// calling thread). Each row is computed by the same code whichever thread runs it.
template <class F>
void for_rows(int64_t t_n, int64_t row_elems, const F& fn) {
  constexpr int64_t kGrainElems = 1 << 15;
  const int64_t grain = row_elems >= kGrainElems ? 1 : kGrainElems / row_elems;
  at::parallel_for(0, t_n, grain, fn);
}

// x [T, H] -> w * bf16(x * rsqrt(mean(x^2) + eps)) per row
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  const int64_t t_n = x.size(0), h = x.size(1);
  at::Tensor out = at::empty_like(x);
  const RowOps& ops = row_ops();
  for_rows(t_n, h, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      ops.rms_norm_row(bits(x) + t * h, bits(w), h, float(eps), bits(out) + t * h);
    }
  });
  return out;
}

// In place on qkv [T, (Hq + 2 Hkv) D]: heads < Hq use the q tables, the next Hkv the k ones.
void rope(const at::Tensor& qkv, const std::vector<at::Tensor>& tables, const at::Tensor& pos,
          int64_t hq, int64_t hkv, int64_t d) {
  const int64_t t_n = qkv.size(0), ld = qkv.size(1), half = d / 2;
  const int64_t* pp = pos.data_ptr<int64_t>();
  const float *cos = tables[0].data_ptr<float>(), *sin = tables[1].data_ptr<float>();
  const float *qcos = tables[2].data_ptr<float>(), *qsin = tables[3].data_ptr<float>();
  const RowOps& ops = row_ops();
  for_rows(t_n, (hq + hkv) * d, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      for (int64_t hd = 0; hd < hq + hkv; ++hd) {
        const int64_t off = pp[t] * half;
        ops.rope_row(bits(qkv) + t * ld + hd * d, (hd < hq ? qcos : cos) + off,
                     (hd < hq ? qsin : sin) + off, half);
      }
    }
  });
}

// gu [T, 2I] (gate | up) -> bf16(bf16(silu(gate)) * up) [T, I]
at::Tensor silu_mul(const at::Tensor& gu, int64_t inter) {
  const int64_t t_n = gu.size(0);
  at::Tensor out = at::empty({t_n, inter}, gu.options());
  const RowOps& ops = row_ops();
  for_rows(t_n, 2 * inter, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const uint16_t* g = bits(gu) + t * 2 * inter;
      ops.silu_mul_row(g, g + inter, inter, bits(out) + t * inter);
    }
  });
  return out;
}

// h += y (bf16 add, one rounding); both contiguous [T, H]
void add_into(const at::Tensor& h, const at::Tensor& y) {
  const int64_t cols = h.size(1);
  const RowOps& ops = row_ops();
  for_rows(h.size(0), cols, [&](int64_t t0, int64_t t1) {
    ops.add_row(bits(h) + t0 * cols, bits(y) + t0 * cols, (t1 - t0) * cols);
  });
}

struct Linear {
  const at::Tensor& w;      // vnni32 fp8 [ceil(N/32), Kp/2, 32, 2] (avx2_16 for gemm_avx2)
  const at::Tensor& scale;  // fp32 [N] (bk == 0) or [ceil(N/bn), ceil(K/bk)]
  int64_t n, bn, bk;
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// y [M, N] bf16 = x [M, K] @ (w * scale).T through gemm.h (no dispatcher, no padding copy
// when K is a multiple of 32; otherwise the gemm op pads x). gemm: dims[5] (GemmKind);
// generated: null or [M] row roles (decode_team.h StepRef::generated), for the AMX GEMM.
at::Tensor linear(const at::Tensor& x, const Linear& l, int64_t gemm, const uint8_t* generated) {
  const int64_t m = x.size(0), k = x.size(1);
  if (gemm_kind(gemm) == GemmKind::kAvx2) {  // the op avx2_w8a16 calls (it widens x)
    return gemm_avx2(x, l.w, l.scale, std::nullopt, l.n, l.bn, l.bk);
  }
  if (k % kPadK != 0 || !x.is_contiguous()) {
    if (gemm_kind(gemm) != GemmKind::kAmx) {
      return gemm_avx512(x, l.w, l.scale, std::nullopt, l.n, l.bn, l.bk, gemm);
    }
    at::Tensor y = at::empty({m, l.n}, x.options());
    for_row_runs(generated, m, [&](int64_t r0, int64_t r1, bool gen) {
      const at::Tensor xr = x.narrow(0, r0, r1 - r0);
      y.narrow(0, r0, r1 - r0)
          .copy_(gen ? gemm_avx512(xr, l.w, l.scale, std::nullopt, l.n, l.bn, l.bk,
                                   kTeamMaxRows)
                     : gemm_amx(xr, l.w, l.scale, std::nullopt, l.n, l.bn, l.bk));
    });
    return y;
  }
  TORCH_CHECK(l.w.scalar_type() == at::kFloat8_e4m3fn && l.w.is_contiguous() &&
                  l.w.dim() == 4 && l.w.size(0) == ceil_div(l.n, kTileN) &&
                  l.w.size(1) == k / 2 && l.scale.scalar_type() == at::kFloat &&
                  l.scale.is_contiguous() &&
                  l.scale.numel() == (l.bk ? ceil_div(l.n, l.bn) * ceil_div(k, l.bk) : l.n),
              "decode_layer: packed weight / scale do not match N=", l.n, ", K=", k);
  at::Tensor y = at::empty({m, l.n}, x.options());
  if (m == 0) return y;
  const GemvArgs a{reinterpret_cast<const uint16_t*>(x.data_ptr()), k, m,
                   reinterpret_cast<const uint8_t*>(l.w.data_ptr()), k, l.n,
                   l.scale.data_ptr<float>(), l.bn, l.bk, l.bk ? ceil_div(k, l.bk) : 0,
                   nullptr, bits(y), l.n};
  if (gemm_kind(gemm) != GemmKind::kAmx) {
    fp8_linear(a, gemm);
    return y;
  }
  for_row_runs(generated, m, [&](int64_t r0, int64_t r1, bool gen) {
    GemvArgs run = a;
    run.x += r0 * k;
    run.m = r1 - r0;
    run.y += r0 * l.n;
    if (gen) {
      fp8_linear(run, kTeamMaxRows);
    } else {
      amx_linear(run);
    }
  });
  return y;
}

at::Tensor attention(const at::Tensor& qkv, const at::Tensor& k_cache, const at::Tensor& v_cache,
                     const std::vector<Fp8KvScales>& fp8, const at::Tensor& slot_mapping,
                     const std::vector<at::Tensor>& idx, c10::IntArrayRef dims) {
  const int64_t hq = dims[0], hkv = dims[1], d = dims[2], t_n = qkv.size(0);
  const at::Tensor k = qkv.narrow(1, hq * d, hkv * d).view({t_n, hkv, d});
  const at::Tensor v = qkv.narrow(1, (hq + hkv) * d, hkv * d).view({t_n, hkv, d});
  const at::Tensor q = qkv.narrow(1, 0, hq * d).view({t_n, hq, d});
  const double scale = 1.0 / std::sqrt(double(d));
  if (fp8.empty()) {
    kv_write(k_cache, v_cache, k, v, slot_mapping);
    return paged_attention(q, k_cache, v_cache, idx[0], idx[1], idx[2], dims[4], scale);
  }
  const Fp8KvScales& s = fp8[0];
  kv_write_fp8(k_cache, v_cache, s.k_scale, s.v_scale, k, v, slot_mapping, s.k_static,
               s.v_static);
  return paged_attention(q, k_cache, v_cache, idx[0], idx[1], idx[2], dims[4], scale,
                         s.k_scale, s.v_scale);
}

// The optional fp8 arguments of decode_layer -> no scales (bf16 caches) or one layer's.
std::vector<Fp8KvScales> layer_fp8(const std::optional<at::Tensor>& k_scale,
                                   const std::optional<at::Tensor>& v_scale, double k_static,
                                   double v_static) {
  TORCH_CHECK(k_scale.has_value() == v_scale.has_value(),
              "decode_layer: pass both k_scale and v_scale (an fp8 cache) or neither");
  if (!k_scale) return {};
  return {Fp8KvScales{*k_scale, *v_scale, k_static, v_static}};
}

// The step's arguments, shared by every layer: h, the rope tables and the positions
// inside them, the index tensors' count.
void check_step(const at::Tensor& h, c10::IntArrayRef dims, at::TensorList rope_tables,
                const at::Tensor& positions, at::TensorList index) {
  TORCH_CHECK(dims.size() == 14 && rope_tables.size() == 4 && index.size() == 3,
              "decode_layer: expects 14 dims, 4 rope tables, 3 index tensors");
  TORCH_CHECK(cpu_isa() >= (gemm_kind(dims[5]) == GemmKind::kAvx2 ? Isa::kAvx2 : Isa::kAvx512),
              "decode_layer: the GEMM of dims[5] = ", dims[5], " needs ",
              gemm_kind(dims[5]) == GemmKind::kAvx2 ? "AVX2" : "AVX-512",
              " (dispatch ISA is ", isa_name(cpu_isa()), ")");
  TORCH_CHECK(h.scalar_type() == at::kBFloat16 && h.dim() == 2 && h.is_contiguous(),
              "decode_layer: h must be contiguous bf16 [T, H], got ", h.sizes());
  const int64_t d = dims[2];
  for (const auto& tb : rope_tables) {
    TORCH_CHECK(tb.scalar_type() == at::kFloat && tb.is_contiguous() && tb.dim() == 2 &&
                    tb.size(1) == d / 2,
                "decode_layer: rope tables must be contiguous fp32 [P, D/2 = ", d / 2, "]");
  }
  TORCH_CHECK(positions.scalar_type() == at::kLong && positions.numel() == h.size(0) &&
                  positions.is_contiguous(),
              "decode_layer: positions must be contiguous int64 [T]");
  for (int64_t t = 0; t < h.size(0); ++t) {
    const int64_t p = positions.data_ptr<int64_t>()[t];
    TORCH_CHECK(p >= 0 && p < rope_tables[0].size(0), "decode_layer: position ", p,
                " outside the rope tables [0, ", rope_tables[0].size(0), ")");
  }
}

// generated_rows -> its [T] row roles (decode_team.h StepRef::generated), or null: uint8 or
// bool [T] contiguous, given only when every layer's GEMM (dims[5], 14 per layer) is AMX's.
const uint8_t* row_roles(const std::optional<at::Tensor>& generated, const at::Tensor& h,
                         c10::IntArrayRef dims) {
  if (!generated) return nullptr;
  const at::Tensor& g = *generated;
  TORCH_CHECK((g.scalar_type() == at::kByte || g.scalar_type() == at::kBool) && g.dim() == 1 &&
                  g.numel() == h.size(0) && g.is_contiguous(),
              "decode_layer: generated_rows must be contiguous uint8 or bool [T = ", h.size(0),
              "], got ", g.scalar_type(), " ", g.sizes());
  for (size_t i = 5; i < dims.size(); i += 14) {
    TORCH_CHECK(gemm_kind(dims[i]) == GemmKind::kAmx,
                "decode_layer: generated_rows applies to layers on the AMX GEMM (dims[5] = ",
                kDimsAmx, "), layer ", i / 14, " has dims[5] = ", dims[i]);
  }
  return reinterpret_cast<const uint8_t*>(g.data_ptr());
}

// One layer's weights: 10 tensors, the norms bf16 [H] (the linears are checked where
// their refs are built).
void check_weights(const at::Tensor& h, at::TensorList weights) {
  TORCH_CHECK(weights.size() == 10, "decode_layer: expects 10 weights, got ", weights.size());
  for (int i = 0; i < 2; ++i) {
    TORCH_CHECK(weights[i].scalar_type() == at::kBFloat16 && weights[i].numel() == h.size(1) &&
                    weights[i].is_contiguous(), "decode_layer: norms must be bf16 [H]");
  }
}

// The team path (decode_team.h) takes 1 <= T <= max_rows with every GEMM's K a multiple
// of 32 (no padding copy) and no caller parallel region; else the per-op path runs.
bool team_step(const at::Tensor& h, c10::IntArrayRef dims, int64_t max_rows) {
  const int64_t hq = dims[0], d = dims[2], inter = dims[3];
  return h.dim() == 2 && h.size(0) >= 1 && h.size(0) <= max_rows && h.size(1) % kPadK == 0 &&
         (hq * d) % kPadK == 0 && inter % kPadK == 0 && !at::in_parallel_region();
}

// decode_layer with its fp8 arguments gathered (none: bf16 caches, else one layer's).
at::Tensor layer_step(const at::Tensor& h, at::TensorList weights, c10::IntArrayRef dims,
                      double eps, at::TensorList rope_tables, const at::Tensor& positions,
                      const at::Tensor& k_cache, const at::Tensor& v_cache,
                      const std::vector<Fp8KvScales>& fp8, const at::Tensor& slot_mapping,
                      at::TensorList index, const uint8_t* generated) {
  check_step(h, dims, rope_tables, positions, index);
  check_weights(h, weights);
  if (team_step(h, dims, 1)) {  // T > 1: the per-op path (the team path's reference)
    return decode_team_op(h, {weights}, {dims}, eps, rope_tables, positions, {k_cache},
                          {v_cache}, fp8, slot_mapping, index, generated);
  }
  const int64_t hq = dims[0], hkv = dims[1], d = dims[2], inter = dims[3], hid = h.size(1);
  const int64_t gm = dims[5];
  std::vector<at::Tensor> tables(rope_tables.begin(), rope_tables.end());
  const Linear qkv_l{weights[2], weights[3], (hq + 2 * hkv) * d, dims[6], dims[7]};
  const Linear o_l{weights[4], weights[5], hid, dims[8], dims[9]};
  const Linear gu_l{weights[6], weights[7], 2 * inter, dims[10], dims[11]};
  const Linear down_l{weights[8], weights[9], hid, dims[12], dims[13]};
  std::vector<at::Tensor> idx(index.begin(), index.end());

  at::Tensor qkv = linear(rms_norm(h, weights[0], eps), qkv_l, gm, generated);
  rope(qkv, tables, positions, hq, hkv, d);
  at::Tensor out = h.clone();
  add_into(out, linear(attention(qkv, k_cache, v_cache, fp8, slot_mapping, idx, dims), o_l,
                       gm, generated));
  at::Tensor gu = linear(rms_norm(out, weights[1], eps), gu_l, gm, generated);
  add_into(out, linear(silu_mul(gu, inter), down_l, gm, generated));
  return out;
}

}  // namespace

at::Tensor decode_layer(const at::Tensor& h, at::TensorList weights, c10::IntArrayRef dims,
                        double eps, at::TensorList rope_tables, const at::Tensor& positions,
                        const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& slot_mapping, at::TensorList index,
                        const std::optional<at::Tensor>& k_scale,
                        const std::optional<at::Tensor>& v_scale, double k_static,
                        double v_static, const std::optional<at::Tensor>& generated_rows) {
  return layer_step(h, weights, dims, eps, rope_tables, positions, k_cache, v_cache,
                    layer_fp8(k_scale, v_scale, k_static, v_static), slot_mapping, index,
                    row_roles(generated_rows, h, dims));
}

}  // namespace fp8serve

namespace fp8serve {

// Every layer in one call: weights = L x the 10 of decode_layer, dims = L x its 14,
// kv [L, 2, num_blocks, Hkv, block_size, D] bf16 contiguous (engine/model/kv_store.py), or
// float8_e4m3fn with kv_scales [L, 2, num_blocks, Hkv, block_size] fp32 and static_scales
// empty or 2 L floats (layer i's k, v at 2 i, 2 i + 1; 0 = per row).
at::Tensor decode_stack(const at::Tensor& h, at::TensorList weights, c10::IntArrayRef dims,
                        double eps, at::TensorList rope_tables, const at::Tensor& positions,
                        const at::Tensor& kv, const at::Tensor& slot_mapping,
                        at::TensorList index, const std::optional<at::Tensor>& kv_scales,
                        c10::ArrayRef<double> static_scales,
                        const std::optional<at::Tensor>& generated_rows) {
  const int64_t layers = kv.dim() == 6 ? kv.size(0) : -1;
  TORCH_CHECK(layers >= 0 && kv.size(1) == 2 && kv.is_contiguous() &&
                  int64_t(weights.size()) == 10 * layers && int64_t(dims.size()) == 14 * layers,
              "decode_stack: kv must be contiguous [L, 2, blocks, Hkv, block_size, D] with "
              "10 L weights and 14 L dims, got kv ", kv.sizes(), ", ", weights.size(),
              " weights, ", dims.size(), " dims");
  TORCH_CHECK(!kv_scales || (kv_scales->dim() == 5 && kv_scales->is_contiguous() &&
                             kv_scales->sizes() == kv.sizes().slice(0, 5)),
              "decode_stack: kv_scales must be contiguous [L, 2, blocks, Hkv, block_size] = ",
              kv.sizes().slice(0, 5), ", got ",
              kv_scales ? kv_scales->sizes() : c10::IntArrayRef{});
  TORCH_CHECK(static_scales.empty() || (kv_scales && int64_t(static_scales.size()) == 2 * layers),
              "decode_stack: static_scales needs kv_scales and 2 L = ", 2 * layers,
              " values, got ", static_scales.size());
  // layer i's K (j = 0) or V (j = 1) cache [blocks, Hkv, block_size, D] and its scales
  // [blocks, Hkv, block_size] (attention.h)
  const uint8_t* generated = row_roles(generated_rows, h, dims);
  auto cache = [&](int64_t i, int64_t j) { return kv.select(0, i).select(0, j); };
  auto fp8_of = [&](int64_t i) -> std::vector<Fp8KvScales> {
    if (!kv_scales) return {};
    const at::Tensor s = kv_scales->select(0, i);
    return {Fp8KvScales{s.select(0, 0), s.select(0, 1),
                        static_scales.empty() ? 0.0 : static_scales[2 * i],
                        static_scales.empty() ? 0.0 : static_scales[2 * i + 1]}};
  };
  if (layers > 0 && team_step(h, dims.slice(0, 14), kTeamMaxRows)) {
    check_step(h, dims.slice(0, 14), rope_tables, positions, index);
    std::vector<at::TensorList> ws;
    std::vector<c10::IntArrayRef> ds;
    std::vector<at::Tensor> ks, vs;
    std::vector<Fp8KvScales> fp8;
    for (int64_t i = 0; i < layers; ++i) {
      ws.push_back(weights.slice(10 * i, 10));
      ds.push_back(dims.slice(14 * i, 14));
      check_weights(h, ws.back());
      ks.push_back(cache(i, 0));
      vs.push_back(cache(i, 1));
      for (Fp8KvScales& s : fp8_of(i)) fp8.push_back(std::move(s));
    }
    return decode_team_op(h, ws, ds, eps, rope_tables, positions, ks, vs, fp8, slot_mapping,
                          index, generated);
  }
  at::Tensor x = h;
  for (int64_t i = 0; i < layers; ++i) {
    x = layer_step(x, weights.slice(10 * i, 10), dims.slice(14 * i, 14), eps, rope_tables,
                   positions, cache(i, 0), cache(i, 1), fp8_of(i), slot_mapping, index,
                   generated);
  }
  return x;
}

}  // namespace fp8serve
