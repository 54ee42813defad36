"""Portable FP8 W8A16 kernels: batch-invariant on any CPU the extension builds for (x86).

portable_w8a16 (per-tensor, per-channel) / portable_block_w8a16 (block scales)
    packed: as avx2_w8a16 (AVX2_LAYOUT: fp8 [ceil(N/16), K, 16], scale fp32 [N] or
            [ceil(N/bn), ceil(K/bk)]; bn, bk multiples of 32)
    apply:  x[M, K] bf16 -> y[M, N] bf16 through ext.gemm_portable
            (ext/csrc/fp8_gemm_portable.cpp): baseline ISA, no intrinsics (GCC vector
            extensions: SSE2 on x86-64). Each output is one fp32 chain over k in order,
            acc = fl(acc + fl(x * w)), no fused multiply-add; block scales fold each
            k-block's chain in order; so row i is bitwise the same for any M. Not bitwise
            equal to avx2_w8a16 (which uses FMA).
Gate: the extension built with the op; nothing else. Placed below the AVX2 kernels, so it
serves hosts without AVX2 (x86-64-v2 virtual CPUs, FP8SERVE_ISA=scalar), where the torch
kernels would make a row's bits depend on the batch.
"""

from __future__ import annotations

import torch

import ext
from engine.hardware import HardwareInfo
from engine.kernels.avx2 import Avx2W8A16
from engine.kernels.avx512 import extension_reason
from engine.kernels.base import ScaleKind


class PortableW8A16(Avx2W8A16):
    id = "portable_w8a16"

    def is_supported(self, hw: HardwareInfo) -> str | None:
        if reason := extension_reason(hw):
            return reason
        if not hasattr(ext.ops(), "gemm_portable"):
            return "C++ extension build lacks gemm_portable"
        return None

    @staticmethod
    def _gemm(*args) -> torch.Tensor:
        return ext.gemm_portable(*args)


class PortableBlockW8A16(PortableW8A16):
    id = "portable_block_w8a16"
    scale_kinds = frozenset({ScaleKind.BLOCK})
