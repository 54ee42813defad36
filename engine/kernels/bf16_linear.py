"""The BF16-weight linear kernel (the lm_head, unquantized decoder linears).

bf16_avx512 (ext/csrc/bf16_gemm_avx512.cpp)
    packed: {"weight": bf16 [ceil(N/32), ceil(K/32)*16, 32, 2]  (BF16_VNNI32_LAYOUT:
                       element [t, p, j, i] = w[32t + j, 2p + i], zero padded)}
    apply:  x[M, K] bf16 -> y[M, N] bf16, or fp32 straight from the fp32 accumulators.
            Batch-invariant: row i of y is bitwise the same for any M and any other rows
            (one dpbf16 chain per output over K in order; work split over N only).
Gate: avx512f/bw/vl + avx512_bf16, the extension built with the op, and an AVX-512
dispatch level (FP8SERVE_ISA may lower it). Elsewhere callers use torch.mm, whose row i
depends on M (oneDNN picks its blocking by shape).

Memory: the packed copy is one more N x K bf16 tensor (plus padding to multiples of 32).
For a tied lm_head the embedding table stays for F.embedding, so the model holds the
V x H table twice: the embedding and the packed head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import ext
from engine.hardware import HardwareInfo
from engine.kernels.avx512 import AVX512_FLAGS, extension_reason, missing_flags
from engine.kernels.base import LayoutError, PackedWeight

KERNEL_ID = "bf16_avx512"
BF16_VNNI32_LAYOUT = "bf16_vnni32[ceil(N/32)][ceil(K/32)*16][32][2]"
AVX512_DISPATCH = ("avx512", "avx512_vbmi", "amx")


def bf16_gemm_reason(hw: HardwareInfo) -> str | None:
    """None when bf16_avx512 can run on this host, else why not."""
    if reason := missing_flags(hw, AVX512_FLAGS) or extension_reason(hw):
        return reason
    if not hasattr(ext.ops(), "gemm_bf16_avx512"):
        return "C++ extension build lacks gemm_bf16_avx512"
    if ext.isa() not in AVX512_DISPATCH:
        return f"dispatch ISA {ext.isa()} is below avx512 (FP8SERVE_ISA)"
    return None


@dataclass(frozen=True, slots=True)
class Bf16Gemm:
    """One BF16 weight packed for bf16_avx512. Stateless apart from the packed tensor."""

    packed: PackedWeight

    @classmethod
    def prepare(cls, weight: torch.Tensor) -> Bf16Gemm:
        """weight [N, K] bf16, row-major contiguous (never a transposed view)."""
        if weight.dim() != 2 or weight.dtype != torch.bfloat16:
            raise LayoutError(f"{KERNEL_ID}: weight must be [N, K] bf16, got "
                              f"{tuple(weight.shape)} {weight.dtype}")
        if not weight.is_contiguous():
            raise LayoutError(f"{KERNEL_ID}: weight [N, K] must be row-major contiguous; got "
                              f"strides {weight.stride()} (a transposed [K, N] view?)")
        n, k = int(weight.shape[0]), int(weight.shape[1])
        packed = PackedWeight(KERNEL_ID, BF16_VNNI32_LAYOUT, n, k,
                              {"weight": ext.pack_bf16_vnni32(weight)})
        return cls(packed)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None,
                 out_fp32: bool = False) -> torch.Tensor:
        """x [M, K] bf16, bias fp32 [N] | None -> y [M, N] bf16 (fp32 with out_fp32)."""
        p = self.packed
        if x.dim() != 2 or x.shape[1] != p.k or x.dtype != torch.bfloat16:
            raise LayoutError(f"{KERNEL_ID}: x must be [M, K={p.k}] bf16, got "
                              f"{tuple(x.shape)} {x.dtype}")
        return ext.gemm_bf16_avx512(x, p.tensors["weight"], bias, p.n, out_fp32)
