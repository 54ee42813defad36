// Op implementations registered in ops.cpp. Layouts (row-major unless noted):
//   fp8_to_bf16: fp8[*] -> bf16[*] (same shape)
//   pack_vnni32: w[N, K] fp8 -> [Np/32, Kp/2, 32, 2] fp8 (Np = ceil32(N), Kp = ceil32(K))
//   pack_avx2:   w[N, K] fp8 -> [Np/16, K, 16] fp8 (Np = ceil16(N))
//   gemm_avx512 / gemm_amx: x[M, K] bf16, w_packed vnni32, scale f32 [N] (block_k == 0)
//       or [ceil(N/block_n), ceil(K/block_k)], bias f32 [N] or none -> y[M, n] bf16
//   gemm_avx2: x[M, K] bf16, w_packed avx2_16, scale f32 [N], bias f32 [N] -> y[M, N] bf16
#pragma once

#include <ATen/ATen.h>

#include <optional>
#include <string>
#include <vector>

namespace fp8serve {

at::Tensor fp8_to_bf16(const at::Tensor& fp8);
at::Tensor pack_vnni32(const at::Tensor& w);
at::Tensor pack_avx2(const at::Tensor& w);
at::Tensor gemm_avx512(const at::Tensor& x, const at::Tensor& w_packed, const at::Tensor& scale,
                       const std::optional<at::Tensor>& bias, int64_t n, int64_t block_n,
                       int64_t block_k, int64_t gemv_max_m);
at::Tensor gemm_amx(const at::Tensor& x, const at::Tensor& w_packed, const at::Tensor& scale,
                    const std::optional<at::Tensor>& bias, int64_t n, int64_t block_n,
                    int64_t block_k);
at::Tensor gemm_avx2(const at::Tensor& x, const at::Tensor& w_packed, const at::Tensor& scale,
                     const std::optional<at::Tensor>& bias, int64_t n);
std::vector<std::string> cpu_features_op();
std::string isa_op();

}  // namespace fp8serve
