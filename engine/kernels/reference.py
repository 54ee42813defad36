"""The dequantization oracle: fp32, obviously correct, slow. Tests compare every kernel
against it; nothing on the serving path calls it."""

from __future__ import annotations

import torch

from engine.kernels.base import (
    DEFAULT_BLOCK,
    FP8_DTYPE,
    FP8_MAX,
    Fp8Weight,
    ScaleKind,
    expected_scale_shape,
)


def dequantize(w: Fp8Weight) -> torch.Tensor:
    """Fp8Weight -> fp32 [N, K]."""
    wf = w.weight.to(torch.float32)
    if w.scale_kind is ScaleKind.PER_TENSOR:
        return wf * w.scale
    if w.scale_kind is ScaleKind.PER_CHANNEL:
        return wf * w.scale[:, None]
    bn, bk = w.block_size
    s = w.scale.repeat_interleave(bn, 0).repeat_interleave(bk, 1)[: w.n, : w.k]
    return wf * s


def reference_linear(
    w: Fp8Weight, x: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """x [M, K] (any float dtype) -> fp32 [M, N]."""
    y = x.to(torch.float32) @ dequantize(w).t()
    if bias is not None:
        y = y + bias.to(torch.float32)
    return y


def quantize_fp8(
    w: torch.Tensor,
    kind: ScaleKind,
    block_size: tuple[int, int] = DEFAULT_BLOCK,
    activation_scale: float | None = None,
) -> Fp8Weight:
    """fp32 [N, K] -> Fp8Weight with amax/448 scales of ``kind`` (for tests/benchmarks)."""
    n, k = w.shape
    w = w.to(torch.float32)
    if kind is ScaleKind.PER_TENSOR:
        scale = (w.abs().amax() / FP8_MAX).clamp_min(1e-12)
        wq = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    elif kind is ScaleKind.PER_CHANNEL:
        scale = (w.abs().amax(dim=1) / FP8_MAX).clamp_min(1e-12)
        wq = (w / scale[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    else:
        bn, bk = block_size
        nb, kb = -(-n // bn), -(-k // bk)
        padded = torch.zeros(nb * bn, kb * bk)
        padded[:n, :k] = w
        blocks = padded.view(nb, bn, kb, bk)
        scale = (blocks.abs().amax(dim=(1, 3)) / FP8_MAX).clamp_min(1e-12)
        wq = (blocks / scale[:, None, :, None]).reshape(nb * bn, kb * bk)[:n, :k]
        wq = wq.clamp(-FP8_MAX, FP8_MAX).contiguous().to(FP8_DTYPE)
    act = None if activation_scale is None else torch.tensor(activation_scale)
    return Fp8Weight(wq.contiguous(), scale.to(torch.float32).reshape(
        expected_scale_shape(kind, n, k, block_size)), kind, act, block_size)


def random_fp8_weight(
    n: int, k: int, kind: ScaleKind, seed: int = 0,
    block_size: tuple[int, int] = DEFAULT_BLOCK, activation_scale: float | None = 0.05,
) -> Fp8Weight:
    """A seeded random layer, quantized with :func:`quantize_fp8` (rows vary in scale so
    per-channel and block scales differ from per-tensor)."""
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * (0.5 + torch.rand(n, 1, generator=g)) * 0.02
    return quantize_fp8(w, kind, block_size, activation_scale)


def reference_linear_w8a8(
    w: Fp8Weight, x: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The W8A8 oracle: x [M, K] quantized to fp8 with the static activation scale, then
    :func:`reference_linear`. -> fp32 [M, N]."""
    assert w.activation_scale is not None, "W8A8 needs a static activation_scale"
    s = w.activation_scale.to(torch.float32)
    xq = (x.to(torch.float32) / s).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return reference_linear(w, xq.to(torch.float32) * s, bias)
