"""NVIDIA GPU (CUDA) FP8 kernels.

cuda_scaled_mm_w8a8 (per-tensor, per-channel; compute capability >= 8.9, i.e. Ada/Hopper
FP8 tensor cores; needs the static activation scale)
    x is quantized to fp8 with the static per-tensor activation scale, then
    torch._scaled_mm(xq [M, K], weight.t() [K, N] column-major, tensor-wise scales,
    out_dtype fp32). Per-channel weight scales run with a unit tensor-wise scale and
    multiply the fp32 result per column (exact, no requantization).
    packed: as torch_scaled_mm_w8a8 (engine/kernels/torch_kernels.py), on "cuda".
    torch._scaled_mm on CUDA needs K and N to be multiples of 16: other layers are
    rejected with that reason and fall to cuda_torch_w8a16.
cuda_torch_w8a16 (every scale kind)
    Dequantize-and-matmul on the CUDA device (engine/kernels/torch_kernels.py).
"""

from __future__ import annotations

from engine.hardware import HardwareInfo
from engine.kernels.base import Fp8Spec, Platform
from engine.kernels.torch_kernels import DeviceTorchW8A16, ScaledMmW8A8

MIN_FP8_CAPABILITY = (8, 9)
SCALED_MM_ALIGN = 16


def _cuda_reason(hw: HardwareInfo) -> str | None:
    return None if hw.cuda_available else "no CUDA device (torch.cuda.is_available() is False)"


class CudaScaledMmW8A8(ScaledMmW8A8):
    id = "cuda_scaled_mm_w8a8"
    platform = Platform.CUDA
    default_device = "cuda"

    def is_supported(self, hw: HardwareInfo) -> str | None:
        reason = _cuda_reason(hw) or super().is_supported(hw)
        if reason:
            return reason
        cap = hw.cuda_capability
        if cap is None or tuple(cap) < MIN_FP8_CAPABILITY:
            want = ".".join(map(str, MIN_FP8_CAPABILITY))
            got = "unknown" if cap is None else ".".join(map(str, cap))
            return f"compute capability {got} < {want} (no FP8 tensor cores)"
        return None

    def can_implement(self, spec: Fp8Spec) -> str | None:
        if spec.n % SCALED_MM_ALIGN or spec.k % SCALED_MM_ALIGN:
            return (f"torch._scaled_mm needs N and K multiples of {SCALED_MM_ALIGN}; "
                    f"got N={spec.n}, K={spec.k}")
        return super().can_implement(spec)


class CudaTorchW8A16(DeviceTorchW8A16):
    """Dequantize-and-matmul on the CUDA device, every scale kind."""

    id = "cuda_torch_w8a16"
    platform = Platform.CUDA
    default_device = "cuda"

    def is_supported(self, hw: HardwareInfo) -> str | None:
        return _cuda_reason(hw)

