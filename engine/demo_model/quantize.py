"""Per-tensor FP8 e4m3 quantization of one weight: scale = amax / 448, W ~= W8 * scale."""

from __future__ import annotations

import torch

from engine.kernels.base import FP8_DTYPE, FP8_MAX


def quantize_fp8(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """w [N, K] float -> (w8 [N, K] float8_e4m3fn, scale fp32 []) with W ~= w8 * scale
    (scale is stored as ``weight_scale_inv``: the dequantization multiplier)."""
    w = w.to(torch.float32)
    amax = w.abs().max()
    scale = (amax / FP8_MAX) if amax > 0 else torch.tensor(1.0)
    w8 = (w / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return w8.contiguous(), scale.to(torch.float32).reshape(())


def dequantize_fp8(w8: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """(w8 [N, K] fp8, scale fp32 []) -> fp32 [N, K]."""
    return w8.to(torch.float32) * scale


def activation_scale(amax: float) -> torch.Tensor:
    """Static per-tensor activation scale fp32 []: x_q = clamp(x / s) fits e4m3."""
    return torch.tensor(max(amax, 1e-6) / FP8_MAX, dtype=torch.float32)
