"""AVX-512 FP8 W8A16 kernels (our own microkernel, ext/csrc/fp8_gemm_avx512.cpp).

avx512_w8a16 (per-tensor, per-channel) / avx512_block_w8a16 (block scales)
    packed: {"weight": fp8 [ceil(N/32), ceil(K/32)*16, 32, 2]  (layout VNNI32_LAYOUT:
                       element [t, p, j, i] = w[32t + j, 2p + i], zero padded),
             "scale":  fp32 [N] (per-tensor broadcast at prepare time) or
                       fp32 [ceil(N/bn), ceil(K/bk)] (block)}
    apply:  x[M, K] bf16 -> y[M, N] bf16, batch-invariant: row i is bitwise the same for
            any M and any other rows (ext/csrc/gemm.h). M <= GEMV_MAX_M: the weight is
            streamed once over torch's intra-op threads, FP8 -> BF16 in registers per
            group of <= 4 rows (M < 8) or per tile and group of 8 rows; larger M: each K
            chunk (1536 deep; 128 below 32 rows) of two 32-column tiles is converted to
            BF16 once per block of <= 512 rows and a 6-row micro-kernel runs the block's
            rows over it. Both run one dpbf16 chain
            per output over K in order (scale on the fp32 sums), so the switch and the
            chunk sizes change speed only. No brgemm on this path.
Gate: avx512f/bw/vl + avx512_bf16, the extension built, its dispatch level >= avx512.
Shapes: any N and K >= 1 (K = 0 is declined in can_implement, as the op requires K >= 1);
block sizes multiples of 32. These checks serve the AMX kernels (amx.py) too.
"""

from __future__ import annotations

from typing import ClassVar

import torch

import ext
from engine.hardware import HardwareInfo
from engine.kernels.base import (
    Fp8Kernel,
    Fp8Spec,
    Fp8Weight,
    LayoutError,
    PackedWeight,
    Platform,
    ScaleKind,
)

VNNI32_LAYOUT = "fp8_vnni32[ceil(N/32)][ceil(K/32)*16][32][2]"
AVX512_FLAGS = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16")
# The in-register conversion path up to this M; the panel path wins above ~48 on Zen 4
# (4096x4096). Results are identical either way (batch invariance).
GEMV_MAX_M = 32
TILE = 32


def extension_reason(hw: HardwareInfo) -> str | None:
    """None when the C++ extension is built, else why not (the compiler error)."""
    if hw.extension.built:
        return None
    return f"C++ extension not built: {hw.extension.error or 'not loaded'}"


def missing_flags(hw: HardwareInfo, flags: tuple[str, ...]) -> str | None:
    missing = [f for f in flags if f not in hw.cpu_flags]
    return f"CPU lacks {', '.join(missing)}" if missing else None


def check_apply(kernel: Fp8Kernel, packed: PackedWeight, layout: str, x: torch.Tensor) -> None:
    """The PackedWeight must come from this kernel, and x must be [M, K] bf16."""
    if packed.kernel_id != kernel.id or packed.layout != layout:
        raise LayoutError(f"{kernel.id}: packed weight is {packed.kernel_id}/{packed.layout}, "
                          f"expected {kernel.id}/{layout}")
    if x.dim() != 2 or x.shape[1] != packed.k or x.dtype != torch.bfloat16:
        raise LayoutError(f"{kernel.id}: x must be [M, K={packed.k}] bf16, got "
                          f"{tuple(x.shape)} {x.dtype}")


def block_reason(spec: Fp8Spec) -> str | None:
    bn, bk = spec.block_size
    if bn % TILE or bk % TILE:
        return f"block size ({bn}, {bk}) is not a multiple of ({TILE}, {TILE})"
    return None


class _Vnni32Kernel(Fp8Kernel):
    """Shared prepare/apply for the kernels on the vnni32 packed weight."""

    platform = Platform.CPU
    batch_invariant = True
    required_flags: ClassVar[tuple[str, ...]] = AVX512_FLAGS

    def is_supported(self, hw: HardwareInfo) -> str | None:
        return (missing_flags(hw, self.required_flags) or extension_reason(hw)
                or hw.dispatch_reason("avx512"))

    def can_implement(self, spec: Fp8Spec) -> str | None:
        if not spec.weight_contiguous:
            return "weight is not a row-major [N, K] tensor (transposed view?)"
        if spec.k == 0:  # the op's GEMMs take K >= 1 (ext/csrc gemm_avx512, gemm_amx)
            return "K = 0 (an empty reduction; the GEMM needs K >= 1)"
        if spec.scale_kind is ScaleKind.BLOCK and (reason := block_reason(spec)):
            return reason
        return super().can_implement(spec)

    def _scale(self, w: Fp8Weight) -> tuple[torch.Tensor, tuple[int, int]]:
        """(fp32 scale for the op, (block_n, block_k)); block_k == 0 means per-channel."""
        if w.scale_kind is ScaleKind.BLOCK:
            return w.scale.contiguous(), w.block_size
        return w.scale.expand(w.n).contiguous(), (0, 0)

    def prepare(self, w: Fp8Weight) -> PackedWeight:
        w.validate(self.id)
        scale, block = self._scale(w)
        return PackedWeight(self.id, VNNI32_LAYOUT, w.n, w.k,
                            {"weight": ext.pack_vnni32(w.weight), "scale": scale},
                            {"scale_kind": w.scale_kind.value, "block": block})

    def _gemm(self, x: torch.Tensor, packed: PackedWeight,
              bias: torch.Tensor | None) -> torch.Tensor:
        bn, bk = packed.meta["block"]  # type: ignore[misc]
        t = packed.tensors
        return ext.gemm_avx512(x, t["weight"], t["scale"], bias, packed.n, bn, bk, GEMV_MAX_M)

    def apply(self, packed: PackedWeight, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        check_apply(self, packed, VNNI32_LAYOUT, x)
        return self._gemm(x, packed, bias)


class Avx512W8A16(_Vnni32Kernel):
    id = "avx512_w8a16"
    scale_kinds = frozenset({ScaleKind.PER_TENSOR, ScaleKind.PER_CHANNEL})


class Avx512BlockW8A16(_Vnni32Kernel):
    id = "avx512_block_w8a16"
    scale_kinds = frozenset({ScaleKind.BLOCK})
