"""Pure-torch FP8 kernels: run on any CPU (ARM included); the last rungs of every table.

torch_w8a16 (per-tensor, per-channel) / torch_block_w8a16 (block)
    packed: {"weight": fp8 [N, K] (the canonical tensor, no copy),
             "scale": fp32 [] | [N] | [ceil(N/bn), ceil(K/bk)]}, layout "fp8[N,K]"
    apply:  dequantize into a bf16 [N, K] scratch buffer reused across calls and layers
            (fp8 -> bf16 is exact), then one bf16 matmul. Per-tensor / per-channel scales
            multiply the fp32-converted result; block scales multiply the bf16 buffer in
            place (one rounding of the exact product).
torch_scaled_mm_w8a8 (per-tensor, per-channel; needs the static activation scale)
    What vLLM falls back to on CPUs without AMX: quantize x with the static activation
    scale and call torch._scaled_mm (which upcasts to fp32 on such CPUs). Per-channel
    weight scales run as a unit per-tensor scale and multiply the fp32 result per column.
    packed: {"weight_t": fp8 [K, N] (the .t() view of the canonical [N, K] tensor, no copy),
             "scale": fp32 [] | [N], "act_scale": fp32 [], "one": fp32 []},
            layout "fp8[N,K].t()"
    K = 0 writes the zero sum itself: torch._scaled_mm leaves its output unwritten there on
    an AMX host (2.13.0+cpu).

:class:`DeviceTorchW8A16` is the same dequantize-and-matmul path for every scale kind on a
chosen device; the XPU and CUDA torch fallbacks are its subclasses.
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
    LayoutError,
    PackedWeight,
    Platform,
    ScaleKind,
)

NON_CONTIGUOUS_REASON = (
    "weight is not a row-major contiguous [N, K] tensor (a transposed [K, N] view?); "
    "refusing to guess its orientation"
)


class _ScratchPool:
    """Per-thread, per-device bf16 scratch, grown on demand and reused (fresh large
    buffers cost page faults on every call)."""

    def __init__(self) -> None:
        self._local = threading.local()

    def get(self, numel: int, device: torch.device) -> torch.Tensor:
        bufs: dict[torch.device, torch.Tensor] = getattr(self._local, "bufs", None) or {}
        buf = bufs.get(device)
        if buf is None or buf.numel() < numel:
            # A normal (non-inference) tensor: writable both inside and outside
            # torch.inference_mode, whichever mode the first caller ran in.
            with torch.inference_mode(False):
                buf = torch.empty(numel, dtype=torch.bfloat16, device=device)
            bufs[device] = buf
            self._local.bufs = bufs
        return buf[:numel]


def dequantize_bf16_into(out: torch.Tensor, weight: torch.Tensor, scale: torch.Tensor,
                         kind: ScaleKind, block_size: tuple[int, int]) -> torch.Tensor:
    """weight fp8 [N, K] -> out bf16 [N, K]. Block scales are applied (out = w * s, one
    rounding); per-tensor / per-channel scales are NOT (callers scale the fp32 result)."""
    out.copy_(weight)  # exact: every finite e4m3 value is representable in bf16
    if kind is not ScaleKind.BLOCK:
        return out
    n, k = out.shape
    bn, bk = block_size
    s_rows = scale.repeat_interleave(bn, 0)[:n]  # fp32 [N, ceil(K/bk)], small
    kb_full = k // bk
    if kb_full:
        out[:, : kb_full * bk].unflatten(1, (kb_full, bk)).mul_(s_rows[:, :kb_full, None])
    if kb_full * bk < k:
        out[:, kb_full * bk:].mul_(s_rows[:, kb_full:])
    return out


def scale_output(y: torch.Tensor, scale: torch.Tensor, kind: ScaleKind,
                 bias: torch.Tensor | None) -> torch.Tensor:
    """y fp32 [M, N] -> bf16 [M, N]: times the per-tensor/per-channel scale, plus bias."""
    if kind is ScaleKind.PER_TENSOR:
        y = y * scale
    elif kind is ScaleKind.PER_CHANNEL:
        y = y * scale[None, :]
    if bias is not None:
        y = y + bias
    return y.to(torch.bfloat16)


def check_x(x: torch.Tensor, k: int, kernel_id: str) -> None:
    if x.dim() != 2 or x.shape[1] != k or x.dtype != torch.bfloat16:
        raise ValueError(f"{kernel_id}: x must be bf16 [M, {k}], got {x.dtype} "
                         f"{tuple(x.shape)}")


def check_packed(packed: PackedWeight, kernel_id: str) -> None:
    if packed.kernel_id != kernel_id:
        raise LayoutError(f"{kernel_id}: packed weight was prepared by {packed.kernel_id} "
                          f"({packed.layout})")


class DeviceTorchW8A16(Fp8Kernel):
    """Dequantize-and-matmul for every scale kind, with tensors on ``self.device``."""

    id = "device_torch_w8a16"
    platform = Platform.CPU
    scale_kinds = frozenset(ScaleKind)
    default_device = "cpu"

    def __init__(self, device: str | torch.device | None = None) -> None:
        self.device = torch.device(device or self.default_device)
        self._scratch = _ScratchPool()

    def is_supported(self, hw: HardwareInfo) -> str | None:
        return None

    def can_implement(self, spec: Fp8Spec) -> str | None:
        if not spec.weight_contiguous:
            return NON_CONTIGUOUS_REASON
        return super().can_implement(spec)

    def prepare(self, w: Fp8Weight) -> PackedWeight:
        w.validate(self.id)
        if w.scale_kind not in self.scale_kinds:
            raise ValueError(f"{self.id}: {self.can_implement(Fp8Spec.of(w))}")
        return PackedWeight(self.id, "fp8[N,K]", w.n, w.k,
                            {"weight": w.weight.to(self.device),
                             "scale": w.scale.to(self.device)},
                            {"scale_kind": w.scale_kind.value, "block_size": w.block_size})

    def apply(self, packed: PackedWeight, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, K] bf16 -> [M, N] bf16; bias fp32 [N] or None."""
        check_x(x, packed.k, self.id)
        check_packed(packed, self.id)
        kind = ScaleKind(packed.meta["scale_kind"])
        w, s = packed.tensors["weight"], packed.tensors["scale"]
        buf = self._scratch.get(w.numel(), w.device).view(packed.n, packed.k)
        wb = dequantize_bf16_into(buf, w, s, kind, packed.meta["block_size"])  # type: ignore[arg-type]
        y = torch.mm(x, wb.t()).float()
        return scale_output(y, s, kind, bias)


class TorchW8A16(DeviceTorchW8A16):
    id = "torch_w8a16"
    scale_kinds = frozenset({ScaleKind.PER_TENSOR, ScaleKind.PER_CHANNEL})


class TorchBlockW8A16(DeviceTorchW8A16):
    id = "torch_block_w8a16"
    scale_kinds = frozenset({ScaleKind.BLOCK})


class ScaledMmW8A8(Fp8Kernel):
    """torch._scaled_mm with the static activation scale, on ``self.device``."""

    id = "scaled_mm_w8a8"
    platform = Platform.CPU
    scale_kinds = frozenset({ScaleKind.PER_TENSOR, ScaleKind.PER_CHANNEL})
    default_device = "cpu"

    def __init__(self, device: str | torch.device | None = None) -> None:
        self.device = torch.device(device or self.default_device)

    def is_supported(self, hw: HardwareInfo) -> str | None:
        return None if hasattr(torch, "_scaled_mm") else "torch._scaled_mm not available"

    def can_implement(self, spec: Fp8Spec) -> str | None:
        if not spec.weight_contiguous:
            return NON_CONTIGUOUS_REASON
        if not spec.has_activation_scale:
            return "needs a static activation_scale (W8A8)"
        return super().can_implement(spec)

    def prepare(self, w: Fp8Weight) -> PackedWeight:
        w.validate(self.id)
        reason = self.can_implement(Fp8Spec.of(w))
        if reason:
            raise ValueError(f"{self.id}: {reason}")
        assert w.activation_scale is not None
        dev = self.device
        return PackedWeight(self.id, "fp8[N,K].t()", w.n, w.k,
                            {"weight_t": w.weight.to(dev).t(), "scale": w.scale.to(dev),
                             "act_scale": w.activation_scale.to(dev),
                             "one": torch.ones((), dtype=torch.float32, device=dev)},
                            {"scale_kind": w.scale_kind.value})

    def apply(self, packed: PackedWeight, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, K] bf16 -> [M, N] bf16; x is quantized to fp8 with the static scale."""
        check_x(x, packed.k, self.id)
        check_packed(packed, self.id)
        t = packed.tensors
        kind = ScaleKind(packed.meta["scale_kind"])
        xq = (x.float() / t["act_scale"]).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
        scale_b = t["scale"] if kind is ScaleKind.PER_TENSOR else t["one"]
        if packed.k == 0:
            # an empty reduction: torch._scaled_mm (2.13.0+cpu, on an AMX host) leaves its
            # output unwritten for K = 0, so the zero sum is written here
            y = torch.zeros(x.shape[0], packed.n, dtype=torch.float32, device=x.device)
        else:
            y = torch._scaled_mm(xq, t["weight_t"], scale_a=t["act_scale"],
                                 scale_b=scale_b, out_dtype=torch.float32)
        if kind is ScaleKind.PER_CHANNEL:
            y = y * t["scale"][None, :]  # scale_b was 1: the weight scale goes per column
        if bias is not None:
            y = y + bias
        return y.to(torch.bfloat16)


class TorchScaledMmW8A8(ScaledMmW8A8):
    id = "torch_scaled_mm_w8a8"
