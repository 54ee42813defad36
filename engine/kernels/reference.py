"""The dequantization oracle: fp32, obviously correct, slow. Tests compare every kernel
against it; nothing on the serving path calls it."""

from __future__ import annotations

import torch

from engine.kernels.base import Fp8Weight, ScaleKind


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
