// The one registration file: schemas for every fp8serve op (TORCH_LIBRARY) and their CPU
// kernels (TORCH_LIBRARY_IMPL). Fake (meta) implementations are registered from Python
// (ext/__init__.py, torch.library.register_fake). Layouts are documented in ops.h.
#include <torch/library.h>

#include "cpuid.h"
#include "isa.h"
#include "ops.h"

namespace fp8serve {

std::vector<std::string> cpu_features_op() { return cpu_features(); }

std::string isa_op() { return isa_name(cpu_isa()); }

}  // namespace fp8serve

TORCH_LIBRARY(fp8serve, m) {
  // fp8[*] float8_e4m3fn -> bf16[*]
  m.def("fp8_to_bf16(Tensor fp8) -> Tensor");
  // w[N, K] fp8 -> [N/32, K/2, 32, 2] fp8 (N, K zero-padded to multiples of 32)
  m.def("pack_vnni32(Tensor w) -> Tensor");
  // w[N, K] fp8 -> [N/16, K, 16] fp8 (N zero-padded to a multiple of 16)
  m.def("pack_avx2(Tensor w) -> Tensor");
  // x[M, K] bf16, w_packed [N/32, K/2, 32, 2] fp8, scale f32 [N] (block_k = 0) or
  // [ceil(N/block_n), ceil(K/block_k)], bias f32 [N]? -> y[M, n] bf16
  m.def(
      "gemm_avx512(Tensor x, Tensor w_packed, Tensor scale, Tensor? bias, int n, "
      "int block_n=0, int block_k=0, int gemv_max_m=32) -> Tensor");
  // the same arguments through the AMX tile kernel (gemm.cpp; below dispatch level amx
  // the same walk on the portable stand-in of the tile operations)
  m.def(
      "gemm_amx(Tensor x, Tensor w_packed, Tensor scale, Tensor? bias, int n, "
      "int block_n=0, int block_k=0) -> Tensor");
  // x[M, K] bf16, w_packed [N/16, K, 16] fp8, scale f32 [N], bias f32 [N]? -> y[M, n] bf16
  m.def("gemm_avx2(Tensor x, Tensor w_packed, Tensor scale, Tensor? bias, int n, "
        "int block_n=0, int block_k=0) -> Tensor");
  // gemm_avx2's arguments on any host (baseline ISA, batch-invariant)
  m.def("gemm_portable(Tensor x, Tensor w_packed, Tensor scale, Tensor? bias, int n, "
        "int block_n=0, int block_k=0) -> Tensor");
  // w[N, K] bf16 -> [N/32, K/2, 32, 2] bf16 (N, K zero-padded to multiples of 32)
  m.def("pack_bf16_vnni32(Tensor w) -> Tensor");
  // x[M, K] bf16, w_packed [N/32, K/2, 32, 2] bf16, bias f32 [N]? -> y[M, n] bf16 | f32
  m.def("gemm_bf16_avx512(Tensor x, Tensor w_packed, Tensor? bias, int n, "
        "bool out_fp32=False) -> Tensor");
  // w[N, K] bf16 -> [N/16, K, 16] bf16 (N zero-padded to a multiple of 16)
  m.def("pack_bf16_avx2(Tensor w) -> Tensor");
  // x[M, K] bf16, w_packed [N/16, K, 16] bf16, bias f32 [N]? -> y[M, n] bf16 | f32
  m.def("gemm_bf16_avx2(Tensor x, Tensor w_packed, Tensor? bias, int n, "
        "bool out_fp32=False) -> Tensor");
  // gemm_bf16_avx2's arguments on any host (baseline ISA, batch-invariant)
  m.def("gemm_bf16_portable(Tensor x, Tensor w_packed, Tensor? bias, int n, "
        "bool out_fp32=False) -> Tensor");
  // q [T, Hq, D] bf16, k_cache / v_cache [blocks, Hkv, bs, D] bf16 (or float8_e4m3fn with
  // k_scale / v_scale [blocks, Hkv, bs] fp32), block_tables [C, W] int32, token_seq [T] int32,
  // ctx_lens [T] int32 -> [T, Hq * D] bf16 (attention.cpp, kv_fp8.cpp)
  m.def(
      "paged_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor block_tables, "
      "Tensor token_seq, Tensor ctx_lens, int block_size, float scale, "
      "Tensor? k_scale=None, Tensor? v_scale=None) -> Tensor");
  // k, v [T, Hkv, D] bf16 -> float8_e4m3fn k_cache / v_cache [blocks, Hkv, bs, D] rows slot_mapping
  // [T] int64 and fp32 k_scale / v_scale [blocks, Hkv, bs] (static scale if > 0, else per row)
  m.def(
      "kv_write_fp8(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor(c!) k_scale, "
      "Tensor(d!) v_scale, Tensor k, Tensor v, Tensor slot_mapping, float k_static=0., "
      "float v_static=0.) -> ()");
  // k, v [T, Hkv, D] bf16 -> k_cache / v_cache [blocks, Hkv, bs, D] rows slot_mapping [T] int64
  m.def(
      "kv_write(Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor k, Tensor v, "
      "Tensor slot_mapping) -> ()");
  // one decoder layer: h [T, H] bf16 -> [T, H] bf16 (decode_layer.cpp); an fp8 cache
  // comes with its k_scale / v_scale [blocks, Hkv, bs] fp32 (written) and static scales;
  // generated_rows: uint8 [T] row roles for layers on the AMX GEMM (1 = the AVX-512 GEMM)
  m.def(
      "decode_layer(Tensor h, Tensor[] weights, int[] dims, float eps, Tensor[] rope_tables, "
      "Tensor positions, Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor slot_mapping, "
      "Tensor[] index, Tensor(c!)? k_scale=None, Tensor(d!)? v_scale=None, "
      "float k_static=0., float v_static=0., Tensor? generated_rows=None) -> Tensor");
  // all decoder layers: h [T, H] bf16 -> [T, H] bf16, kv [L, 2, blocks, Hkv, bs, D] written
  // (fp8: with kv_scales [L, 2, blocks, Hkv, bs] fp32, written, and 2 L static scales)
  m.def(
      "decode_stack(Tensor h, Tensor[] weights, int[] dims, float eps, Tensor[] rope_tables, "
      "Tensor positions, Tensor(a!) kv, Tensor slot_mapping, Tensor[] index, "
      "Tensor(b!)? kv_scales=None, float[] static_scales=[], "
      "Tensor? generated_rows=None) -> Tensor");
  // buf (any dtype, contiguous, nbytes a positive multiple of 64) -> int64 [] XOR of its
  // 64-bit words, read on all threads (read_probe.cpp: the read-bandwidth probe)
  m.def("read_xor(Tensor buf) -> Tensor");
  // cpuid + XCR0 features (names of engine/hardware.py CPU_FEATURES); the dispatch ISA
  m.def("cpu_features() -> str[]", &fp8serve::cpu_features_op);
  m.def("isa() -> str", &fp8serve::isa_op);
}

TORCH_LIBRARY_IMPL(fp8serve, CPU, m) {
  m.impl("fp8_to_bf16", &fp8serve::fp8_to_bf16);
  m.impl("pack_vnni32", &fp8serve::pack_vnni32);
  m.impl("pack_avx2", &fp8serve::pack_avx2);
  m.impl("gemm_avx512", &fp8serve::gemm_avx512);
  m.impl("gemm_amx", &fp8serve::gemm_amx);
  m.impl("gemm_avx2", &fp8serve::gemm_avx2);
  m.impl("gemm_portable", &fp8serve::gemm_portable);
  m.impl("pack_bf16_vnni32", &fp8serve::pack_bf16_vnni32);
  m.impl("gemm_bf16_avx512", &fp8serve::gemm_bf16_avx512);
  m.impl("pack_bf16_avx2", &fp8serve::pack_bf16_avx2);
  m.impl("gemm_bf16_avx2", &fp8serve::gemm_bf16_avx2);
  m.impl("gemm_bf16_portable", &fp8serve::gemm_bf16_portable);
  m.impl("paged_attention", &fp8serve::paged_attention);
  m.impl("kv_write", &fp8serve::kv_write);
  m.impl("kv_write_fp8", &fp8serve::kv_write_fp8);
  m.impl("decode_layer", &fp8serve::decode_layer);
  m.impl("decode_stack", &fp8serve::decode_stack);
  m.impl("read_xor", &fp8serve::read_xor);
}
