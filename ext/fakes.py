"""Fake (meta) implementations of the fp8serve ops, so torch.compile / FakeTensor tracing
knows the output shapes. Each checks the layout it documents, naming the expected shape."""

from __future__ import annotations

import torch

FP8 = torch.float8_e4m3fn


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _check_x(x: torch.Tensor, op: str) -> None:
    torch._check(x.dim() == 2, lambda: f"{op}: x must be [M, K], got {tuple(x.shape)}")
    torch._check(x.dtype == torch.bfloat16, lambda: f"{op}: x must be bf16, got {x.dtype}")


def _check_scale(scale: torch.Tensor, n: int, k: int, bn: int, bk: int, op: str) -> None:
    want = (n,) if bk == 0 else (_cdiv(n, bn), _cdiv(k, bk))
    torch._check(tuple(scale.shape) == want and scale.dtype == torch.float32,
                 lambda: f"{op}: scale must be float32 {want}, got {tuple(scale.shape)}")


def _check_bias(bias: torch.Tensor | None, n: int, op: str) -> None:
    if bias is not None:
        torch._check(tuple(bias.shape) == (n,) and bias.dtype == torch.float32,
                     lambda: f"{op}: bias must be float32 [{n}], got {tuple(bias.shape)}")


def fp8_to_bf16(fp8: torch.Tensor) -> torch.Tensor:
    torch._check(fp8.dtype == FP8, lambda: f"fp8_to_bf16: input must be fp8, got {fp8.dtype}")
    return torch.empty_like(fp8, dtype=torch.bfloat16)


def pack_vnni32(w: torch.Tensor) -> torch.Tensor:
    torch._check(w.dim() == 2 and w.dtype == FP8, lambda: "pack_vnni32: w must be [N, K] fp8")
    n, k = w.shape
    return w.new_empty((_cdiv(n, 32), _cdiv(k, 32) * 16, 32, 2))


def pack_avx2(w: torch.Tensor) -> torch.Tensor:
    torch._check(w.dim() == 2 and w.dtype == FP8, lambda: "pack_avx2: w must be [N, K] fp8")
    n, k = w.shape
    return w.new_empty((_cdiv(n, 16), k, 16))


def _gemm_vnni(op: str, x: torch.Tensor, w_packed: torch.Tensor, scale: torch.Tensor,
               bias: torch.Tensor | None, n: int, block_n: int, block_k: int) -> torch.Tensor:
    _check_x(x, op)
    k = x.shape[1]
    want = (_cdiv(n, 32), _cdiv(k, 32) * 16, 32, 2)
    torch._check(tuple(w_packed.shape) == want and w_packed.dtype == FP8,
                 lambda: f"{op}: w_packed must be [N/32, K/2, 32, 2] = {want} fp8, "
                         f"got {tuple(w_packed.shape)}")
    _check_scale(scale, n, k, block_n, block_k, op)
    _check_bias(bias, n, op)
    return x.new_empty((x.shape[0], n))


def gemm_avx512(x, w_packed, scale, bias, n, block_n=0, block_k=0, gemv_max_m=32):
    return _gemm_vnni("gemm_avx512", x, w_packed, scale, bias, n, block_n, block_k)


def gemm_amx(x, w_packed, scale, bias, n, block_n=0, block_k=0):
    return _gemm_vnni("gemm_amx", x, w_packed, scale, bias, n, block_n, block_k)


def _avx2_16_gemm(op):
    def fake(x, w_packed, scale, bias, n, block_n=0, block_k=0):
        _check_x(x, op)
        want = (_cdiv(n, 16), x.shape[1], 16)
        torch._check(tuple(w_packed.shape) == want and w_packed.dtype == FP8,
                     lambda: f"{op}: w_packed must be [N/16, K, 16] = {want} fp8, "
                             f"got {tuple(w_packed.shape)}")
        _check_scale(scale, n, x.shape[1], block_n, block_k, op)
        _check_bias(bias, n, op)
        return x.new_empty((x.shape[0], n))
    return fake


gemm_avx2 = _avx2_16_gemm("gemm_avx2")
gemm_portable = _avx2_16_gemm("gemm_portable")


def pack_bf16_vnni32(w: torch.Tensor) -> torch.Tensor:
    torch._check(w.dim() == 2 and w.dtype == torch.bfloat16,
                 lambda: "pack_bf16_vnni32: w must be [N, K] bf16")
    n, k = w.shape
    return w.new_empty((_cdiv(n, 32), _cdiv(k, 32) * 16, 32, 2))


def gemm_bf16_avx512(x, w_packed, bias, n, out_fp32=False):
    _check_x(x, "gemm_bf16_avx512")
    want = (_cdiv(n, 32), _cdiv(x.shape[1], 32) * 16, 32, 2)
    torch._check(tuple(w_packed.shape) == want and w_packed.dtype == torch.bfloat16,
                 lambda: f"gemm_bf16_avx512: w_packed must be [N/32, K/2, 32, 2] = {want} "
                         f"bf16, got {tuple(w_packed.shape)}")
    _check_bias(bias, n, "gemm_bf16_avx512")
    return x.new_empty((x.shape[0], n), dtype=torch.float32 if out_fp32 else torch.bfloat16)


def pack_bf16_avx2(w: torch.Tensor) -> torch.Tensor:
    torch._check(w.dim() == 2 and w.dtype == torch.bfloat16,
                 lambda: "pack_bf16_avx2: w must be [N, K] bf16")
    n, k = w.shape
    return w.new_empty((_cdiv(n, 16), k, 16))


def _bf16_avx2_16_gemm(op):
    def fake(x, w_packed, bias, n, out_fp32=False):
        _check_x(x, op)
        want = (_cdiv(n, 16), x.shape[1], 16)
        torch._check(tuple(w_packed.shape) == want and w_packed.dtype == torch.bfloat16,
                     lambda: f"{op}: w_packed must be [N/16, K, 16] = {want} bf16, "
                             f"got {tuple(w_packed.shape)}")
        _check_bias(bias, n, op)
        return x.new_empty((x.shape[0], n),
                           dtype=torch.float32 if out_fp32 else torch.bfloat16)
    return fake


gemm_bf16_avx2 = _bf16_avx2_16_gemm("gemm_bf16_avx2")
gemm_bf16_portable = _bf16_avx2_16_gemm("gemm_bf16_portable")


def paged_attention(q, k_cache, v_cache, block_tables, token_seq, ctx_lens, block_size,
                    scale, k_scale=None, v_scale=None):
    torch._check(q.dim() == 3 and q.dtype == torch.bfloat16,
                 lambda: f"paged_attention: q must be bf16 [T, Hq, D], got {tuple(q.shape)}")
    torch._check(k_cache.dim() == 4 and k_cache.shape[2] == block_size
                 and k_cache.shape[3] == q.shape[2]
                 and tuple(v_cache.shape) == tuple(k_cache.shape),
                 lambda: f"paged_attention: k_cache / v_cache must be [blocks, Hkv, block_size, "
                         f"D], got {tuple(k_cache.shape)} / {tuple(v_cache.shape)}")
    torch._check(block_tables.dim() == 2 and block_tables.dtype == torch.int32,
                 lambda: "paged_attention: block_tables must be int32 [C, W]")
    fp8 = k_cache.dtype == torch.float8_e4m3fn
    torch._check((k_scale is not None and v_scale is not None) == fp8,
                 lambda: "paged_attention: k_scale / v_scale are given exactly for fp8 caches")
    if fp8:
        _check_kv_scales(k_cache, k_scale, "paged_attention")
        _check_kv_scales(v_cache, v_scale, "paged_attention")
    return q.new_empty((q.shape[0], q.shape[1] * q.shape[2]))


def _check_kv_scales(cache, scale, op):
    want = tuple(cache.shape[:3])
    torch._check(scale.dtype == torch.float32 and tuple(scale.shape) == want,
                 lambda: f"{op}: scales must be fp32 [blocks, Hkv, block_size] = {want}, got "
                         f"{scale.dtype} {tuple(scale.shape)}")


def kv_write_fp8(k_cache, v_cache, k_scale, v_scale, k, v, slot_mapping, k_static=0.0,
                 v_static=0.0):
    torch._check(k_cache.dtype == torch.float8_e4m3fn and k_cache.dim() == 4,
                 lambda: "kv_write_fp8: caches must be float8_e4m3fn [blocks, Hkv, block_size, D]")
    torch._check(k.dim() == 3 and k.shape[1] == k_cache.shape[1]
                 and k.shape[2] == k_cache.shape[3] and k.shape[0] == slot_mapping.shape[0],
                 lambda: f"kv_write_fp8: k must be [T, Hkv, D] = [T, {k_cache.shape[1]}, "
                         f"{k_cache.shape[3]}] with slot_mapping [T], got {tuple(k.shape)}")
    _check_kv_scales(k_cache, k_scale, "kv_write_fp8")
    _check_kv_scales(v_cache, v_scale, "kv_write_fp8")


def kv_write(k_cache, v_cache, k, v, slot_mapping):
    torch._check(k_cache.dim() == 4 and k_cache.dtype == torch.bfloat16
                 and tuple(v_cache.shape) == tuple(k_cache.shape),
                 lambda: "kv_write: caches must be bf16 [blocks, Hkv, block_size, D]")
    for x in (k, v):
        torch._check(x.dim() == 3 and x.shape[0] == slot_mapping.shape[0]
                     and x.shape[1] == k_cache.shape[1] and x.shape[2] == k_cache.shape[3],
                     lambda: f"kv_write: k/v must be [T, Hkv, D] = [T, {k_cache.shape[1]}, "
                             f"{k_cache.shape[3]}] with slot_mapping [T]")


def decode_layer(h, weights, dims, eps, rope_tables, positions, k_cache, v_cache,
                 slot_mapping, index, k_scale=None, v_scale=None, k_static=0.0, v_static=0.0):
    torch._check(h.dim() == 2 and h.dtype == torch.bfloat16,
                 lambda: f"decode_layer: h must be bf16 [T, H], got {tuple(h.shape)}")
    torch._check(k_cache.dim() == 4 and tuple(v_cache.shape) == tuple(k_cache.shape),
                 lambda: "decode_layer: K/V caches must be [blocks, Hkv, block_size, D]")
    torch._check((k_scale is None) == (v_scale is None),
                 lambda: "decode_layer: pass both k_scale and v_scale (an fp8 cache) or neither")
    if k_scale is not None:
        _check_kv_scales(k_cache, k_scale, "decode_layer")
        _check_kv_scales(v_cache, v_scale, "decode_layer")
    return torch.empty_like(h)


def decode_stack(h, weights, dims, eps, rope_tables, positions, kv, slot_mapping, index,
                 kv_scales=None, static_scales=()):
    torch._check(h.dim() == 2 and h.dtype == torch.bfloat16,
                 lambda: f"decode_stack: h must be bf16 [T, H], got {tuple(h.shape)}")
    torch._check(kv.dim() == 6 and kv.shape[1] == 2,
                 lambda: f"decode_stack: kv must be [L, 2, blocks, Hkv, block_size, D], got "
                         f"{tuple(kv.shape)}")
    torch._check(kv_scales is None or tuple(kv_scales.shape) == tuple(kv.shape[:5]),
                 lambda: f"decode_stack: kv_scales must be [L, 2, blocks, Hkv, block_size] = "
                         f"{tuple(kv.shape[:5])}")
    return torch.empty_like(h)


def read_xor(buf):
    nbytes = buf.numel() * buf.element_size()
    torch._check(nbytes >= 64 and nbytes % 64 == 0,
                 lambda: f"read_xor: buf must hold a positive multiple of 64 bytes, got {nbytes}")
    return buf.new_empty((), dtype=torch.int64)


FAKES = {
    "fp8_to_bf16": fp8_to_bf16,
    "pack_vnni32": pack_vnni32,
    "pack_avx2": pack_avx2,
    "gemm_avx512": gemm_avx512,
    "gemm_amx": gemm_amx,
    "gemm_avx2": gemm_avx2,
    "gemm_portable": gemm_portable,
    "paged_attention": paged_attention,
    "kv_write": kv_write,
    "kv_write_fp8": kv_write_fp8,
    "decode_layer": decode_layer,
    "decode_stack": decode_stack,
    "pack_bf16_vnni32": pack_bf16_vnni32,
    "gemm_bf16_avx512": gemm_bf16_avx512,
    "pack_bf16_avx2": pack_bf16_avx2,
    "gemm_bf16_avx2": gemm_bf16_avx2,
    "gemm_bf16_portable": gemm_bf16_portable,
    "read_xor": read_xor,
}


def register() -> None:
    for name, fn in FAKES.items():
        torch.library.register_fake(f"fp8serve::{name}")(fn)
