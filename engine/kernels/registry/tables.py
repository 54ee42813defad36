"""The kernel ids and the priority tables: which FP8 kernel classes exist ("module:Class",
imported on first use), each platform and scale kind's order of preference, the bf16
kernel ids the operator's overrides may also name, the override environment variables,
and the error raised when no table entry can run a layer."""

from __future__ import annotations

from engine.kernels.base import Platform, ScaleKind

# kernel id -> "module:Class" (imported on first use).
KERNEL_CLASSES: dict[str, str] = {
    "amx_w8a16": "engine.kernels.amx:AmxW8A16",
    "amx_block_w8a16": "engine.kernels.amx:AmxBlockW8A16",
    "avx512_w8a16": "engine.kernels.avx512:Avx512W8A16",
    "avx512_block_w8a16": "engine.kernels.avx512:Avx512BlockW8A16",
    "avx2_w8a16": "engine.kernels.avx2:Avx2W8A16",
    "avx2_block_w8a16": "engine.kernels.avx2:Avx2BlockW8A16",
    "portable_w8a16": "engine.kernels.portable:PortableW8A16",
    "portable_block_w8a16": "engine.kernels.portable:PortableBlockW8A16",
    "torch_w8a16": "engine.kernels.torch_kernels:TorchW8A16",
    "torch_block_w8a16": "engine.kernels.torch_kernels:TorchBlockW8A16",
    "torch_scaled_mm_w8a8": "engine.kernels.torch_kernels:TorchScaledMmW8A8",
    "xpu_block_fp8": "engine.kernels.xpu:XpuBlockFp8",
    "xpu_w8a16": "engine.kernels.xpu:XpuW8A16",
    "xpu_torch_w8a16": "engine.kernels.xpu:XpuTorchW8A16",
    "cuda_scaled_mm_w8a8": "engine.kernels.cuda:CudaScaledMmW8A8",
    "cuda_torch_w8a16": "engine.kernels.cuda:CudaTorchW8A16",
}

_CPU_W8A16 = ("amx_w8a16", "avx512_w8a16", "avx2_w8a16", "portable_w8a16", "torch_w8a16",
              "torch_scaled_mm_w8a8")

PRIORITY: dict[tuple[Platform, ScaleKind], tuple[str, ...]] = {
    (Platform.CPU, ScaleKind.PER_TENSOR): _CPU_W8A16,
    (Platform.CPU, ScaleKind.PER_CHANNEL): _CPU_W8A16,
    (Platform.CPU, ScaleKind.BLOCK): ("amx_block_w8a16", "avx512_block_w8a16",
                                      "avx2_block_w8a16", "portable_block_w8a16",
                                      "torch_block_w8a16"),
    (Platform.XPU, ScaleKind.PER_TENSOR): ("xpu_w8a16", "xpu_torch_w8a16"),
    (Platform.XPU, ScaleKind.PER_CHANNEL): ("xpu_w8a16", "xpu_torch_w8a16"),
    (Platform.XPU, ScaleKind.BLOCK): ("xpu_block_fp8", "xpu_torch_w8a16"),
    (Platform.CUDA, ScaleKind.PER_TENSOR): ("cuda_scaled_mm_w8a8", "cuda_torch_w8a16"),
    (Platform.CUDA, ScaleKind.PER_CHANNEL): ("cuda_scaled_mm_w8a8", "cuda_torch_w8a16"),
    (Platform.CUDA, ScaleKind.BLOCK): ("cuda_torch_w8a16",),
}

# the bf16 linears' table (the lm_head, unquantized linears: engine/kernels/bf16_linear.py,
# which selects among them), named here so the operator's overrides can force or disable
# them too
BF16_KERNEL_IDS = ("bf16_avx512", "bf16_avx2", "bf16_portable", "torch_mm")

KNOWN_IDS = (*KERNEL_CLASSES, *BF16_KERNEL_IDS)

ENV_FORCED = "FP8SERVE_KERNEL"

ENV_DISABLED = "FP8SERVE_DISABLED_KERNELS"

DISABLED_REASON = "disabled by operator (FP8SERVE_DISABLED_KERNELS / --disable-kernel)"


class NoKernelError(RuntimeError):
    """No kernel in the table can run this layer; the message lists every reason."""
