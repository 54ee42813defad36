"""Pure-torch FP8 kernels: run on any CPU (ARM included). The last rungs of every CPU table.

torch_w8a16 / torch_block_w8a16
    packed: {"weight": fp8 [N, K] (the canonical tensor, no copy),
             "scale": fp32 [] | [N] | [ceil(N/bn), ceil(K/bk)]}
    apply:  dequantize into a bf16 scratch buffer reused across calls and layers, then
            one bf16 matmul with the fp32 scale folded in.
torch_scaled_mm_w8a8
    What vLLM falls back to on CPUs without AMX: quantize x with the static activation
    scale and call torch._scaled_mm (which upcasts to fp32 on such CPUs).
    packed: {"weight_t": fp8 [K, N] (a .t() view of the canonical [N, K] tensor),
             "scale": fp32 [], "act_scale": fp32 []}
"""

from __future__ import annotations

import threading

import torch

from engine.hardware import HardwareInfo
from engine.kernels.base import (
    FP8_DTYPE,
    FP8_MAX,
    Fp8Kernel,
    Fp8Spec,
    Fp8Weight,
    PackedWeight,
    Platform,
    ScaleKind,
)


class _ScratchPool:
    """Per-thread bf16 scratch, grown on demand and reused (fresh large buffers cost page
    faults on every call)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def get(self, numel: int) -> torch.Tensor:
        buf = getattr(self._local, "buf", None)
        if buf is None or buf.numel() < numel:
            buf = torch.empty(numel, dtype=torch.bfloat16)
            self._local.buf = buf
        return buf[:numel]


class TorchW8A16(Fp8Kernel):
    id = "torch_w8a16"
    platform = Platform.CPU
    scale_kinds = frozenset({ScaleKind.PER_TENSOR, ScaleKind.PER_CHANNEL})

    def __init__(self) -> None:
        self._scratch = _ScratchPool()

    def is_supported(self, hw: HardwareInfo) -> str | None:
        return None

    def can_implement(self, spec: Fp8Spec) -> str | None:
        if not spec.weight_contiguous:
            return "weight is not a row-major [N, K] tensor"
        return super().can_implement(spec)

    def prepare(self, w: Fp8Weight) -> PackedWeight:
        w.validate(self.id)
        return PackedWeight(self.id, "fp8[N,K]", w.n, w.k,
                            {"weight": w.weight, "scale": w.scale},
                            {"scale_kind": w.scale_kind.value, "block_size": w.block_size})

    def _dequant_bf16(self, packed: PackedWeight) -> torch.Tensor:
        w = packed.tensors["weight"]
        out = self._scratch.get(w.numel()).view(packed.n, packed.k)
        out.copy_(w)  # exact: every finite e4m3 value is representable in bf16
        return out

    def apply(self, packed: PackedWeight, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        w = self._dequant_bf16(packed)
        scale = packed.tensors["scale"]
        y = torch.mm(x, w.t()).float()
        y = y * scale if scale.dim() == 0 else y * scale[None, :]
        if bias is not None:
            y = y + bias
        return y.to(torch.bfloat16)


class TorchBlockW8A16(TorchW8A16):
    id = "torch_block_w8a16"
    scale_kinds = frozenset({ScaleKind.BLOCK})

    def _dequant_bf16(self, packed: PackedWeight) -> torch.Tensor:
        w = packed.tensors["weight"]
        bn, bk = packed.meta["block_size"]  # type: ignore[misc]
        s = packed.tensors["scale"]
        s_full = s.repeat_interleave(bn, 0).repeat_interleave(bk, 1)[: packed.n, : packed.k]
        out = self._scratch.get(w.numel()).view(packed.n, packed.k)
        out.copy_(w.to(torch.float32) * s_full)
        return out

    def apply(self, packed: PackedWeight, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        y = torch.mm(x, self._dequant_bf16(packed).t()).float()
        if bias is not None:
            y = y + bias
        return y.to(torch.bfloat16)


class TorchScaledMmW8A8(Fp8Kernel):
    id = "torch_scaled_mm_w8a8"
    platform = Platform.CPU
    scale_kinds = frozenset({ScaleKind.PER_TENSOR})

    def is_supported(self, hw: HardwareInfo) -> str | None:
        return None if hasattr(torch, "_scaled_mm") else "torch._scaled_mm not available"

    def can_implement(self, spec: Fp8Spec) -> str | None:
        if not spec.has_activation_scale:
            return "needs a static activation_scale"
        return super().can_implement(spec)

    def prepare(self, w: Fp8Weight) -> PackedWeight:
        w.validate(self.id)
        assert w.activation_scale is not None
        return PackedWeight(self.id, "fp8[N,K].t()", w.n, w.k,
                            {"weight_t": w.weight.t(), "scale": w.scale,
                             "act_scale": w.activation_scale})

    def apply(self, packed: PackedWeight, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        t = packed.tensors
        xq = (x.float() / t["act_scale"]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
        y = torch._scaled_mm(xq, t["weight_t"], scale_a=t["act_scale"], scale_b=t["scale"],
                             out_dtype=torch.float32)
        if bias is not None:
            y = y + bias
        return y.to(torch.bfloat16)
