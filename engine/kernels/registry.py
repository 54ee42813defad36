"""Priority-ordered kernel tables and per-layer selection.

For a layer (an :class:`Fp8Spec`) on a host (:class:`HardwareInfo`), the chosen kernel is
the first entry of the platform's table for that scale kind that is not disabled, is
supported by the hardware and can implement the spec. Every kernel passed over is recorded
as a :class:`Rejection` with its reason. A forced kernel (FP8SERVE_KERNEL) goes first; a
layer it cannot implement falls back down the table with a warning, never an error.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass
from functools import cache

from engine.hardware import HardwareInfo
from engine.kernels.base import Fp8Kernel, Fp8Spec, Platform, ScaleKind

# kernel id -> "module:Class". Modules import lazily so a kernel whose module fails to
# import (e.g. a missing optional dependency) is rejected with that reason, not a crash.
KERNEL_CLASSES: dict[str, str] = {
    "amx_w8a16": "engine.kernels.amx:AmxW8A16",
    "amx_block_w8a16": "engine.kernels.amx:AmxBlockW8A16",
    "avx512_w8a16": "engine.kernels.avx512:Avx512W8A16",
    "avx512_block_w8a16": "engine.kernels.avx512:Avx512BlockW8A16",
    "avx2_w8a16": "engine.kernels.avx2:Avx2W8A16",
    "torch_w8a16": "engine.kernels.torch_kernels:TorchW8A16",
    "torch_block_w8a16": "engine.kernels.torch_kernels:TorchBlockW8A16",
    "torch_scaled_mm_w8a8": "engine.kernels.torch_kernels:TorchScaledMmW8A8",
    "xpu_block_fp8": "engine.kernels.xpu:XpuBlockFp8",
    "xpu_w8a16": "engine.kernels.xpu:XpuW8A16",
    "xpu_torch_w8a16": "engine.kernels.xpu:XpuTorchW8A16",
    "cuda_scaled_mm_w8a8": "engine.kernels.cuda:CudaScaledMmW8A8",
    "cuda_torch_w8a16": "engine.kernels.cuda:CudaTorchW8A16",
}

PRIORITY: dict[tuple[Platform, ScaleKind], tuple[str, ...]] = {
    (Platform.CPU, ScaleKind.PER_TENSOR): (
        "amx_w8a16", "avx512_w8a16", "avx2_w8a16", "torch_w8a16", "torch_scaled_mm_w8a8",
    ),
    (Platform.CPU, ScaleKind.PER_CHANNEL): (
        "amx_w8a16", "avx512_w8a16", "avx2_w8a16", "torch_w8a16", "torch_scaled_mm_w8a8",
    ),
    (Platform.CPU, ScaleKind.BLOCK): (
        "amx_block_w8a16", "avx512_block_w8a16", "torch_block_w8a16",
    ),
    (Platform.XPU, ScaleKind.PER_TENSOR): ("xpu_w8a16", "xpu_torch_w8a16"),
    (Platform.XPU, ScaleKind.PER_CHANNEL): ("xpu_w8a16", "xpu_torch_w8a16"),
    (Platform.XPU, ScaleKind.BLOCK): ("xpu_block_fp8", "xpu_torch_w8a16"),
    (Platform.CUDA, ScaleKind.PER_TENSOR): ("cuda_scaled_mm_w8a8", "cuda_torch_w8a16"),
    (Platform.CUDA, ScaleKind.PER_CHANNEL): ("cuda_scaled_mm_w8a8", "cuda_torch_w8a16"),
    (Platform.CUDA, ScaleKind.BLOCK): ("cuda_torch_w8a16",),
}


class NoKernelError(RuntimeError):
    """No kernel in the table can run this layer; the message lists every reason."""


@dataclass(frozen=True, slots=True)
class KernelOverrides:
    forced: str | None = None  # FP8SERVE_KERNEL
    disabled: frozenset[str] = frozenset()  # FP8SERVE_DISABLED_KERNELS

    def __post_init__(self) -> None:
        unknown = ({self.forced} if self.forced else set()) | set(self.disabled)
        unknown -= set(KERNEL_CLASSES)
        if unknown:
            raise ValueError(
                f"unknown kernel id(s) {sorted(unknown)}; known: {sorted(KERNEL_CLASSES)}"
            )

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> KernelOverrides:
        env = dict(os.environ) if env is None else env
        forced = env.get("FP8SERVE_KERNEL") or None
        disabled = env.get("FP8SERVE_DISABLED_KERNELS", "")
        return cls(forced, frozenset(k.strip() for k in disabled.split(",") if k.strip()))


@dataclass(frozen=True, slots=True)
class Rejection:
    kernel_id: str
    reason: str


@dataclass(frozen=True, slots=True)
class Selection:
    kernel: Fp8Kernel
    rejections: tuple[Rejection, ...]
    # Kernels after the winner that could also run this layer, in priority order: the
    # runtime-fallback chain.
    fallbacks: tuple[Fp8Kernel, ...] = ()
    warning: str | None = None  # e.g. the forced kernel could not implement this layer


@dataclass(frozen=True, slots=True)
class _Loaded:
    kernel: Fp8Kernel | None
    error: str | None = None


@cache
def _load(kernel_id: str) -> _Loaded:
    module_name, cls_name = KERNEL_CLASSES[kernel_id].split(":")
    try:
        cls = getattr(importlib.import_module(module_name), cls_name)
    except (ImportError, AttributeError) as exc:
        return _Loaded(None, f"kernel module unavailable: {exc}")
    return _Loaded(cls())


def get_kernel(kernel_id: str) -> Fp8Kernel:
    loaded = _load(kernel_id)
    if loaded.kernel is None:
        raise NoKernelError(f"{kernel_id}: {loaded.error}")
    return loaded.kernel


def platform_for(hw: HardwareInfo) -> Platform:
    """The platform the model runs on: XPU, then CUDA, then CPU."""
    if hw.xpu_available:
        return Platform.XPU
    if hw.cuda_available:
        return Platform.CUDA
    return Platform.CPU


def candidate_ids(platform: Platform, kind: ScaleKind, overrides: KernelOverrides) -> list[str]:
    table = list(PRIORITY[(platform, kind)])
    if overrides.forced:
        table = [overrides.forced] + [k for k in table if k != overrides.forced]
    return [k for k in table if k not in overrides.disabled]


def _reject_reason(kernel_id: str, spec: Fp8Spec, hw: HardwareInfo) -> str | None:
    loaded = _load(kernel_id)
    if loaded.kernel is None:
        return loaded.error
    return loaded.kernel.is_supported(hw) or loaded.kernel.can_implement(spec)


def select_kernel(
    spec: Fp8Spec,
    hw: HardwareInfo,
    overrides: KernelOverrides = KernelOverrides(),
    platform: Platform | None = None,
) -> Selection:
    platform = platform or platform_for(hw)
    ids = candidate_ids(platform, spec.scale_kind, overrides)
    rejections: list[Rejection] = []
    ok: list[Fp8Kernel] = []
    for kid in ids:
        reason = _reject_reason(kid, spec, hw)
        if reason is None:
            ok.append(get_kernel(kid))
        elif not ok:
            rejections.append(Rejection(kid, reason))
    if not ok:
        detail = "; ".join(f"{r.kernel_id}: {r.reason}" for r in rejections) or "empty table"
        raise NoKernelError(
            f"no {platform.value} kernel for {spec.scale_kind.value} [N={spec.n}, K={spec.k}]: "
            f"{detail}"
        )
    warning = None
    if overrides.forced and ok[0].id != overrides.forced:
        forced_reason = next(
            (r.reason for r in rejections if r.kernel_id == overrides.forced), "not in table"
        )
        warning = (
            f"forced kernel {overrides.forced} cannot run this layer ({forced_reason}); "
            f"using {ok[0].id}"
        )
    return Selection(ok[0], tuple(rejections), tuple(ok[1:]), warning)


@dataclass(frozen=True, slots=True)
class TableEntry:
    kernel_id: str
    supported: bool
    reason: str | None


def describe_tables(hw: HardwareInfo) -> dict[str, list[TableEntry]]:
    """Every table, every kernel, supported or not and why: for `fp8serve kernels`."""
    out: dict[str, list[TableEntry]] = {}
    for (platform, kind), ids in PRIORITY.items():
        entries = []
        for kid in ids:
            loaded = _load(kid)
            reason = loaded.error if loaded.kernel is None else loaded.kernel.is_supported(hw)
            entries.append(TableEntry(kid, reason is None, reason))
        out[f"{platform.value}/{kind.value}"] = entries
    return out


