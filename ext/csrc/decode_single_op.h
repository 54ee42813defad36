// Torch-side entry of the single-token decode path (decode_single.h): checks the
// arguments of decode_layer / decode_stack for T == 1 and builds the plain-pointer refs.
#pragma once

#include <ATen/ATen.h>

#include <vector>

namespace fp8serve {

// h [1, H] bf16 -> [1, H] bf16 through layers i < weights.size(): weights[i] = the 10
// tensors of decode_layer, dims[i] its 14 dims, k_caches[i] / v_caches[i] [S, Hkv, D] bf16
// (the token's K/V row written at slot_mapping[0]); rope tables, positions [1] and the
// index tensors (block_tables, token_seq, ctx_lens) as for decode_layer.
at::Tensor decode_single_op(const at::Tensor& h, const std::vector<at::TensorList>& weights,
                            const std::vector<c10::IntArrayRef>& dims, double eps,
                            at::TensorList rope_tables, const at::Tensor& positions,
                            const std::vector<at::Tensor>& k_caches,
                            const std::vector<at::Tensor>& v_caches,
                            const at::Tensor& slot_mapping, at::TensorList index);

}  // namespace fp8serve
