// Torch-side entry of the team decode path (decode_team.h): checks the arguments of
// decode_layer / decode_stack for 1 <= T <= kTeamMaxRows and builds the plain-pointer refs.
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace fp8serve {

// One fp8 layer cache's dequant scales (engine/model/kv_store.py LayerKV): k_scale /
// v_scale fp32 [blocks, Hkv, bs] (written with the step's rows) and the static scales
// (0 = per row).
struct Fp8KvScales {
  at::Tensor k_scale, v_scale;
  double k_static = 0.0, v_static = 0.0;
};

// h [T, H] bf16 -> [T, H] bf16 through layers i < weights.size(): weights[i] = the 10
// tensors of decode_layer, dims[i] its 14 dims, k_caches[i] / v_caches[i]
// [blocks, Hkv, bs, D] bf16, or float8_e4m3fn with fp8[i] their scales (fp8 empty: bf16
// caches; token t's K/V rows written at slot_mapping[t]); rope tables, positions [T]
// (checked by the caller against the tables) and the index tensors (block_tables [C, W],
// token_seq [T], ctx_lens [T], int32) as for decode_layer; generated: null, or [T] row
// roles (decode_team.h StepRef::generated) already checked by the caller.
at::Tensor decode_team_op(const at::Tensor& h, const std::vector<at::TensorList>& weights,
                          const std::vector<c10::IntArrayRef>& dims, double eps,
                          at::TensorList rope_tables, const at::Tensor& positions,
                          const std::vector<at::Tensor>& k_caches,
                          const std::vector<at::Tensor>& v_caches,
                          const std::vector<Fp8KvScales>& fp8,
                          const at::Tensor& slot_mapping, at::TensorList index,
                          const uint8_t* generated = nullptr);

}  // namespace fp8serve
