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
// pack_bf16_vnni32: w[N, K] bf16 -> [Np/32, Kp/2, 32, 2] bf16 (pack_vnni32's order)
at::Tensor pack_bf16_vnni32(const at::Tensor& w);
// gemm_bf16_avx512: x[M, K] bf16, w_packed bf16 [Np/32, Kp/2, 32, 2], bias f32 [N] or none
//   -> y[M, n] bf16 (fp32 when out_fp32); batch-invariant (gemm.h)
// pack_bf16_avx2: w[N, K] bf16 -> [Np/16, K, 16] bf16 (pack_avx2's order)
at::Tensor pack_bf16_avx2(const at::Tensor& w);
// gemm_bf16_avx2: x[M, K] bf16, w_packed bf16 [Np/16, K, 16], bias f32 [N] or none
//   -> y[M, n] bf16 (fp32 when out_fp32); batch-invariant
at::Tensor gemm_bf16_avx2(const at::Tensor& x, const at::Tensor& w_packed,
                          const std::optional<at::Tensor>& bias, int64_t n, bool out_fp32);
// gemm_bf16_portable: gemm_bf16_avx2's arguments; baseline ISA (any host), batch-invariant
//   (isa.h portable::)
at::Tensor gemm_bf16_portable(const at::Tensor& x, const at::Tensor& w_packed,
                              const std::optional<at::Tensor>& bias, int64_t n, bool out_fp32);
at::Tensor gemm_bf16_avx512(const at::Tensor& x, const at::Tensor& w_packed,
                            const std::optional<at::Tensor>& bias, int64_t n, bool out_fp32);
at::Tensor gemm_avx512(const at::Tensor& x, const at::Tensor& w_packed, const at::Tensor& scale,
                       const std::optional<at::Tensor>& bias, int64_t n, int64_t block_n,
                       int64_t block_k, int64_t gemv_max_m);
at::Tensor gemm_amx(const at::Tensor& x, const at::Tensor& w_packed, const at::Tensor& scale,
                    const std::optional<at::Tensor>& bias, int64_t n, int64_t block_n,
                    int64_t block_k);
// gemm_avx2: scale [N] (block_k == 0) or [ceil(N/block_n), ceil(K/block_k)] fp32 (block_n a
//   multiple of 32, block_k of 32): x's k-block b is scaled by the column block's scale
//   (one fp32 rounding per element) before the per-channel GEMM, row by row.
at::Tensor gemm_avx2(const at::Tensor& x, const at::Tensor& w_packed, const at::Tensor& scale,
                     const std::optional<at::Tensor>& bias, int64_t n, int64_t block_n,
                     int64_t block_k);
// gemm_portable: gemm_avx2's arguments; baseline ISA (any host), one multiply-then-add
//   chain per output, block scales folded per k-block (isa.h portable::); batch-invariant
at::Tensor gemm_portable(const at::Tensor& x, const at::Tensor& w_packed,
                         const at::Tensor& scale, const std::optional<at::Tensor>& bias,
                         int64_t n, int64_t block_n, int64_t block_k);
// paged_attention: q [T, Hq, D] bf16, k_cache / v_cache [blocks, Hkv, bs, D] bf16 (k_scale /
//   v_scale none) or float8_e4m3fn (k_scale / v_scale [blocks, Hkv, bs] fp32 dequant multipliers),
//   block_tables [C, W] int32, token_seq [T] int32, ctx_lens [T] int32 -> [T, Hq * D] bf16
at::Tensor paged_attention(const at::Tensor& q, const at::Tensor& k_cache,
                           const at::Tensor& v_cache, const at::Tensor& block_tables,
                           const at::Tensor& token_seq, const at::Tensor& ctx_lens,
                           int64_t block_size, double scale,
                           const std::optional<at::Tensor>& k_scale = std::nullopt,
                           const std::optional<at::Tensor>& v_scale = std::nullopt);
// kv_write_fp8: k, v [T, Hkv, D] bf16 -> float8_e4m3fn rows slot_mapping [T] int64 of
//   k_cache / v_cache [blocks, Hkv, bs, D] and their fp32 scales k_scale / v_scale
//   [blocks, Hkv, bs]:
//   s = static scale if > 0, else amax(|x[t, h, :]|) / 448 (1 if amax < 1e-30);
//   q = e4m3(clamp(x / s, -448, 448)) rounded to nearest even (kv_fp8.cpp)
void kv_write_fp8(const at::Tensor& k_cache, const at::Tensor& v_cache,
                  const at::Tensor& k_scale, const at::Tensor& v_scale, const at::Tensor& k,
                  const at::Tensor& v, const at::Tensor& slot_mapping, double k_static,
                  double v_static);
// kv_write: k, v [T, Hkv, D] bf16 -> rows slot_mapping [T] int64 of k_cache / v_cache
//   [blocks, Hkv, bs, D]
void kv_write(const at::Tensor& k_cache, const at::Tensor& v_cache, const at::Tensor& k,
              const at::Tensor& v, const at::Tensor& slot_mapping);
// decode_layer: one decoder layer h [T, H] bf16 -> [T, H] bf16 (argument list in
//   decode_layer.cpp), writing the layer's K/V of the step into k_cache / v_cache (bf16,
//   or float8_e4m3fn with k_scale / v_scale [blocks, Hkv, bs] fp32 and the static scales);
//   generated_rows uint8 [T]: rows whose linears run the AVX-512 GEMM where the layer's is
//   the AMX one (decode_team.h StepRef::generated)
at::Tensor decode_layer(const at::Tensor& h, at::TensorList weights, c10::IntArrayRef dims,
                        double eps, at::TensorList rope_tables, const at::Tensor& positions,
                        const at::Tensor& k_cache, const at::Tensor& v_cache,
                        const at::Tensor& slot_mapping, at::TensorList index,
                        const std::optional<at::Tensor>& k_scale = std::nullopt,
                        const std::optional<at::Tensor>& v_scale = std::nullopt,
                        double k_static = 0.0, double v_static = 0.0,
                        const std::optional<at::Tensor>& generated_rows = std::nullopt);
// decode_stack: every layer's decode_layer in one call, kv [L, 2, blocks, Hkv, bs, D] bf16,
//   or float8_e4m3fn with kv_scales [L, 2, blocks, Hkv, bs] fp32 (+ 2 L static scales)
at::Tensor decode_stack(const at::Tensor& h, at::TensorList weights, c10::IntArrayRef dims,
                        double eps, at::TensorList rope_tables, const at::Tensor& positions,
                        const at::Tensor& kv, const at::Tensor& slot_mapping,
                        at::TensorList index,
                        const std::optional<at::Tensor>& kv_scales = std::nullopt,
                        c10::ArrayRef<double> static_scales = {},
                        const std::optional<at::Tensor>& generated_rows = std::nullopt);
// read_xor: buf (any dtype, contiguous CPU, nbytes a positive multiple of 64) -> int64 []
//   XOR of its 64-bit words, read by every thread (read_probe.cpp: the bandwidth probe)
at::Tensor read_xor(const at::Tensor& buf);
std::vector<std::string> cpu_features_op();
std::string isa_op();

}  // namespace fp8serve
