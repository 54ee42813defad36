"""AMX FP8 W8A16 kernels: brgemm on BF16 tiles unpacked from the vnni32 FP8 weight.

amx_w8a16 (per-tensor, per-channel) / amx_block_w8a16 (block scales)
    packed: {"weight": fp8 [ceil(N/32), ceil(K/32)*16, 32, 2] (VNNI32_LAYOUT, as avx512),
             "scale":  per-channel fp32 [N] (applied on the fp32 accumulators);
                       per-tensor as a synthetic block scale fp32 [1, ceil(K/128)] with
                       block (ceil(N/32)*32, 128); block fp32 [ceil(N/bn), ceil(K/bk)]}
    apply:  x[M, K] bf16 -> y[M, N] bf16. M <= 4: the AVX-512 GEMV (every AMX CPU has
            AVX-512 BF16). Else per 32-column tile and 128-deep K chunk: unpack the FP8
            tile to BF16 (block scale folded in), at::native::cpublas::brgemm into an fp32
            [M, 32] accumulator (AMX tiles on AMX hosts; oneDNN AVX-512 elsewhere).
Gate: AMX tile + bf16 granted by the OS (hw.amx_usable), AVX-512 BF16, extension built,
dispatch level amx (FP8SERVE_ISA may lower it).
Real AMX execution is unverified on the development host (no AMX); its tests run the
same code with brgemm on oneDNN's AVX-512 kernels.
"""

from __future__ import annotations

import math

import torch

import ext
from engine.hardware import HardwareInfo
from engine.kernels.avx512 import TILE, _Vnni32Kernel
from engine.kernels.base import Fp8Weight, PackedWeight, ScaleKind

AMX_K_CHUNK = 128


class _AmxKernel(_Vnni32Kernel):
    def is_supported(self, hw: HardwareInfo) -> str | None:
        if not hw.amx_usable:
            if hw.has("amx_tile", "amx_bf16"):
                return "AMX present but the OS did not grant tile state (arch_prctl)"
            return "CPU lacks AMX tile/bf16"
        return super().is_supported(hw) or hw.dispatch_reason("amx")

    def _scale(self, w: Fp8Weight) -> tuple[torch.Tensor, tuple[int, int]]:
        if w.scale_kind is ScaleKind.PER_TENSOR:
            kb = math.ceil(w.k / AMX_K_CHUNK)
            block_n = math.ceil(w.n / TILE) * TILE
            return w.scale.reshape(1, 1).expand(1, kb).contiguous(), (block_n, AMX_K_CHUNK)
        return super()._scale(w)

    def _gemm(self, x: torch.Tensor, packed: PackedWeight,
              bias: torch.Tensor | None) -> torch.Tensor:
        bn, bk = packed.meta["block"]  # type: ignore[misc]
        t = packed.tensors
        return ext.gemm_amx(x, t["weight"], t["scale"], bias, packed.n, bn, bk)


class AmxW8A16(_AmxKernel):
    id = "amx_w8a16"
    scale_kinds = frozenset({ScaleKind.PER_TENSOR, ScaleKind.PER_CHANNEL})


class AmxBlockW8A16(_AmxKernel):
    id = "amx_block_w8a16"
    scale_kinds = frozenset({ScaleKind.BLOCK})
