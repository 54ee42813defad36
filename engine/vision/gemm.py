"""How the vision tower runs its GEMMs on this host, chosen once by measuring.

Weights stay bf16 (memory-mapped as stored, or concatenated at load: weights.py). Two paths:

- ``bf16``: activations bf16, ``F.linear(x bf16 [M, K], w bf16 [N, K])`` (oneDNN). Fast
  where the CPU has AVX-512 BF16 / AMX.
- ``fp32``: activations fp32; each weight is widened to fp32 for its GEMM (one [N, K]
  temporary at a time, never kept) and multiplied in fp32. On AVX2-only CPUs torch's
  bf16 GEMM is emulated and several times slower than this.

The project's packed BF16 kernel (engine/kernels/bf16_linear.py) needs AVX-512 BF16 and
packs a second copy of each weight; on hosts that have it, oneDNN's bf16 GEMM is the
``bf16`` path here. :func:`choose_gemm` times both on a [256, 1024] x [1024, 1024]
product and keeps the faster; FP8SERVE_VISION_GEMM=bf16|fp32 forces one."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

MODES = ("bf16", "fp32")


@dataclass(frozen=True, slots=True)
class VisionGemm:
    mode: str  # one of MODES
    why: str  # how it was chosen (measured rates or forced)

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"vision GEMM mode {self.mode!r} not in {MODES}")

    @property
    def act_dtype(self) -> torch.dtype:
        """Activation dtype of the tower and projector."""
        return torch.bfloat16 if self.mode == "bf16" else torch.float32

    def linear(self, x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        """x [M, K] act_dtype, w [N, K] bf16 -> [M, N] act_dtype."""
        return F.linear(x, w if w.dtype == x.dtype else w.to(x.dtype))


def _rate(dtype: torch.dtype, reps: int = 3) -> float:
    x = torch.randn(256, 1024).to(dtype)
    w = torch.randn(1024, 1024).to(torch.bfloat16)
    gemm = VisionGemm("bf16" if dtype == torch.bfloat16 else "fp32", "probe")
    gemm.linear(x, w)
    t0 = time.perf_counter()
    for _ in range(reps):
        gemm.linear(x, w)
    return 2 * 256 * 1024 * 1024 * reps / (time.perf_counter() - t0) / 1e9


def choose_gemm() -> VisionGemm:
    forced = os.environ.get("FP8SERVE_VISION_GEMM")
    if forced:
        if forced not in MODES:
            raise ValueError(f"FP8SERVE_VISION_GEMM={forced!r}: one of {', '.join(MODES)} "
                             "(unset: the faster on this host, measured)")
        return VisionGemm(forced, "forced by FP8SERVE_VISION_GEMM")
    bf16, fp32 = _rate(torch.bfloat16), _rate(torch.float32)
    mode = "bf16" if bf16 >= fp32 else "fp32"
    return VisionGemm(mode, f"measured: bf16 {bf16:.1f} GFLOP/s, fp32 from bf16 weights "
                            f"{fp32:.1f} GFLOP/s")
