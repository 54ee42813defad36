"""AVX2 + FMA + F16C FP8 W8A16 kernel for x86 CPUs without AVX-512.

avx2_w8a16 (per-tensor, per-channel) / avx2_block_w8a16 (block scales)
    packed: {"weight": fp8 [ceil(N/16), K, 16] (AVX2_LAYOUT: element [t, c, j] =
                       w[16t + j, c], zero padded),
             "scale":  fp32 [N] (per-tensor broadcast at prepare time) or
                       fp32 [ceil(N/bn), ceil(K/bk)] (block; bn, bk multiples of 32)}
    apply:  x[M, K] bf16 -> y[M, N] bf16: x widened to FP32 and prescaled by 2^112 when
            every |x| < 2^16, the FP8 codes then widened by a shuffle, shift and mask (else
            through FP16 bits and vcvtph2ps; the same products, so the same bits), FP32
            FMA, 16-column tiles over torch's intra-op threads (ext/csrc/fp8_gemm_avx2.cpp).
            Block scales: for each column block, x's k-block b multiplied by its scale (one
            FP32 rounding per element, a function of that row alone) before the same GEMM,
            so both are batch-invariant.
Gate: avx2, fma, f16c, the extension built, its dispatch level >= avx2.
"""

from __future__ import annotations

import torch

import ext
from engine.hardware import HardwareInfo
from engine.kernels.avx512 import block_reason, check_apply, extension_reason, missing_flags
from engine.kernels.base import (
    Fp8Kernel,
    Fp8Spec,
    Fp8Weight,
    PackedWeight,
    Platform,
    ScaleKind,
)

AVX2_LAYOUT = "fp8_avx2_16[ceil(N/16)][K][16]"
AVX2_FLAGS = ("avx2", "fma", "f16c")


class Avx2W8A16(Fp8Kernel):
    id = "avx2_w8a16"
    platform = Platform.CPU
    scale_kinds = frozenset({ScaleKind.PER_TENSOR, ScaleKind.PER_CHANNEL})
    batch_invariant = True

    def is_supported(self, hw: HardwareInfo) -> str | None:
        return (missing_flags(hw, AVX2_FLAGS) or extension_reason(hw)
                or hw.dispatch_reason("avx2"))

    def can_implement(self, spec: Fp8Spec) -> str | None:
        if not spec.weight_contiguous:
            return "weight is not a row-major [N, K] tensor (transposed view?)"
        if spec.scale_kind is ScaleKind.BLOCK and (reason := block_reason(spec)):
            return reason
        return super().can_implement(spec)

    def prepare(self, w: Fp8Weight) -> PackedWeight:
        w.validate(self.id)
        if w.scale_kind is ScaleKind.BLOCK:
            scale, block = w.scale.contiguous(), w.block_size
        else:
            scale, block = w.scale.expand(w.n).contiguous(), (0, 0)
        return PackedWeight(self.id, AVX2_LAYOUT, w.n, w.k,
                            {"weight": ext.pack_avx2(w.weight), "scale": scale},
                            {"scale_kind": w.scale_kind.value, "block": block})

    def apply(self, packed: PackedWeight, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        check_apply(self, packed, AVX2_LAYOUT, x)
        t = packed.tensors
        bn, bk = packed.meta.get("block", (0, 0))  # type: ignore[misc]
        return self._gemm(x, t["weight"], t["scale"], bias, packed.n, bn, bk)

    @staticmethod
    def _gemm(*args) -> torch.Tensor:  # the op on the avx2_16 layout (gemm_avx2's args)
        return ext.gemm_avx2(*args)


class Avx2BlockW8A16(Avx2W8A16):
    id = "avx2_block_w8a16"
    scale_kinds = frozenset({ScaleKind.BLOCK})
