"""One layer's kernel: selection, preparation and runtime fallback, recorded in a
:class:`KernelReport` that feeds `fp8serve kernels`, GET /kernels and the metrics."""

from __future__ import annotations

import logging
import threading
from dataclasses import asdict, dataclass, field

import torch

from engine.hardware import HardwareInfo
from engine.kernels.base import Fp8Kernel, Fp8Spec, Fp8Weight, PackedWeight, Platform
from engine.kernels.registry import (
    KernelOverrides,
    NoKernelError,
    Rejection,
    platform_for,
    select_kernel,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class LayerChoice:
    layer: str
    kernel_id: str
    platform: str
    scale_kind: str
    n: int
    k: int
    rejections: tuple[Rejection, ...]
    warning: str | None = None


@dataclass(frozen=True, slots=True)
class RuntimeFallback:
    layer: str
    from_kernel: str
    to_kernel: str
    error: str


@dataclass
class KernelReport:
    """Thread-safe record of every layer's kernel choice and every runtime fallback."""

    choices: dict[str, LayerChoice] = field(default_factory=dict)
    fallbacks: list[RuntimeFallback] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record_choice(self, choice: LayerChoice) -> None:
        with self._lock:
            self.choices[choice.layer] = choice

    def record_fallback(self, fb: RuntimeFallback) -> None:
        with self._lock:
            self.fallbacks.append(fb)
            old = self.choices.get(fb.layer)
            if old is not None:
                self.choices[fb.layer] = LayerChoice(
                    old.layer, fb.to_kernel, old.platform, old.scale_kind, old.n, old.k,
                    old.rejections + (Rejection(fb.from_kernel, f"runtime error: {fb.error}"),),
                    old.warning,
                )

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            return {
                "layers": [asdict(c) for c in self.choices.values()],
                "runtime_fallbacks": [asdict(f) for f in self.fallbacks],
            }


class LayerKernel:
    """Runs one FP8 linear layer: y[M, N] bf16 = x[M, K] bf16 @ W.T (+ bias).

    If the chosen kernel raises on its first call, the layer moves to the next kernel of
    its fallback chain (logged and recorded); later errors propagate.
    """

    def __init__(self, name: str, weight: Fp8Weight, hw: HardwareInfo,
                 overrides: KernelOverrides, report: KernelReport,
                 bias: torch.Tensor | None = None, platform: Platform | None = None) -> None:
        weight.validate(name)
        self.name = name
        self.weight = weight  # kept (memory-mapped) to re-prepare on runtime fallback
        self.bias = bias
        self._report = report
        spec = Fp8Spec.of(weight, has_bias=bias is not None)
        platform = platform or platform_for(hw)
        sel = select_kernel(spec, hw, overrides, platform)
        if sel.warning:
            log.warning("%s: %s", name, sel.warning)
        self.kernel: Fp8Kernel = sel.kernel
        self._chain = list(sel.fallbacks)
        self.packed: PackedWeight = self.kernel.prepare(weight)
        self._verified = False
        report.record_choice(LayerChoice(
            name, self.kernel.id, platform.value, weight.scale_kind.value, weight.n, weight.k,
            sel.rejections, sel.warning,
        ))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self._verified:
            return self.kernel.apply(self.packed, x, self.bias)
        while True:
            try:
                y = self.kernel.apply(self.packed, x, self.bias)
                self._verified = True
                return y
            except Exception as exc:  # noqa: BLE001 - any kernel failure triggers fallback
                self._fall_back(exc)

    def _fall_back(self, exc: Exception) -> None:
        if not self._chain:
            raise NoKernelError(f"{self.name}: {self.kernel.id} failed and no fallback "
                                f"remains: {exc}") from exc
        nxt = self._chain.pop(0)
        log.warning("%s: kernel %s failed on first call (%s); falling back to %s",
                    self.name, self.kernel.id, exc, nxt.id)
        self._report.record_fallback(RuntimeFallback(self.name, self.kernel.id, nxt.id,
                                                     f"{type(exc).__name__}: {exc}"))
        self.kernel, self.packed = nxt, nxt.prepare(self.weight)
