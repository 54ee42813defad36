"""One layer's kernel: selection, preparation and runtime fallback, recorded in a
:class:`KernelReport` that feeds `fp8serve kernels`, GET /kernels and the metrics.

Counter data for the metrics (see :meth:`KernelReport.selected_counts`,
:meth:`KernelReport.rejection_counts`, :meth:`KernelReport.fallback_counts`):

    fp8serve_kernel_selected{kernel, platform, scale_kind}      layers on that kernel
    fp8serve_kernel_rejections{kernel, reason}                  layers that passed it over
    fp8serve_kernel_runtime_fallbacks_total{from_kernel, to_kernel}

and, per layer group (service/kernel_metrics.py, from :meth:`KernelReport.snapshot`):

    fp8serve_layer_group_kernel{layer_group, kernel}            layers on that kernel
    fp8serve_layer_group_generated_rows_kernel{layer_group, kernel}
                                              layers whose generated rows run that kernel
    fp8serve_kernel_startup_fallbacks{layer_group, from_kernel, to_kernel}
    fp8serve_decoder_layers{path, reason}     decoder layers on the fused C++ op or the
                                              Python layers (:meth:`KernelReport.decoder_counts`)
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace

import torch

from engine.hardware import HardwareInfo
from engine.kernels.base import Fp8Kernel, Fp8Spec, Fp8Weight, PackedWeight, Platform
from engine.kernels.registry import (
    DEFAULT_CATALOG,
    KernelCatalog,
    KernelOverrides,
    NoKernelError,
    Rejection,
    is_batch_invariant,
    platform_for,
    select_kernel,
)
from engine.memory import WeightSource

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
    # registry.first_choice for this layer's table; kernel_id differing from it at
    # startup is a startup fallback (a later runtime fallback changes kernel_id only)
    first_choice: str | None = None
    # the kernel of the layer's generated rows (registry.generated_kernel), None: every
    # row on kernel_id
    generated_kernel_id: str | None = None


# the stage of a runtime fallback of a layer's generated rows (AMX hosts): its from_kernel
# is the generated rows' kernel, and the layer stays on the kernel it was given at load
GENERATED_ROWS_STAGE = "apply (generated rows)"


@dataclass(frozen=True, slots=True)
class RuntimeFallback:
    layer: str
    from_kernel: str
    to_kernel: str
    error: str
    # "apply" (first call), "prepare" (packing at load), or "apply (generated rows)": the
    # generated rows' kernel failed its first call, and the layer's own kernel runs them
    stage: str = "apply"


@dataclass
class KernelReport:
    """Thread-safe record of every layer's kernel choice and every runtime fallback."""

    choices: dict[str, LayerChoice] = field(default_factory=dict)
    fallbacks: list[RuntimeFallback] = field(default_factory=list)
    # Each decoder layer's path, read live (set by the ModelRunner once the model is built):
    # None = the fused C++ op, else why the Python layer runs (fusion_reasons in
    # engine/model/ministral.py, which a failing first call of the op updates).
    decoder_reasons: Callable[[], list[str | None]] | None = field(default=None, repr=False)
    # The attention path, read live (PagedAttention.describe): {"path", "reason",
    # "batch_invariant"}; None without a model.
    attention_state: Callable[[], dict[str, object]] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record_choice(self, choice: LayerChoice) -> None:
        with self._lock:
            self.choices[choice.layer] = choice

    def record_fallback(self, fb: RuntimeFallback) -> None:
        """The layer now runs ``fb.to_kernel``; ``fb.from_kernel`` joins its rejections."""
        with self._lock:
            self.fallbacks.append(fb)
            old = self.choices.get(fb.layer)
            if old is not None:
                why = Rejection(fb.from_kernel, f"runtime error ({fb.stage}): {fb.error}")
                self.choices[fb.layer] = replace(
                    old, kernel_id=fb.to_kernel, rejections=old.rejections + (why,),
                    generated_kernel_id=None)

    def selected_counts(self) -> dict[tuple[str, str, str], int]:
        """(kernel, platform, scale_kind) -> number of layers running on it."""
        with self._lock:
            return dict(Counter((c.kernel_id, c.platform, c.scale_kind)
                                for c in self.choices.values()))

    def rejection_counts(self) -> dict[tuple[str, str], int]:
        """(kernel, reason) -> number of layers for which it was passed over."""
        with self._lock:
            return dict(Counter((r.kernel_id, r.reason) for c in self.choices.values()
                                for r in c.rejections))

    def rows_by_role(self) -> bool:
        """Whether some decoder layer (``layers.*``, whose outputs feed the K/V) runs its
        generated rows on another kernel than its prompt rows: K/V then depends on a
        position's role, and the prefix cache keys blocks by role too. The lm_head's
        rows feed no K/V."""
        with self._lock:
            return any(c.generated_kernel_id and c.layer.startswith("layers.")
                       for c in self.choices.values())

    def generated_counts(self) -> dict[tuple[str, str], int]:
        """(kernel, generated rows' kernel) -> layers whose generated rows run another
        kernel than their prompt rows."""
        with self._lock:
            return dict(Counter((c.kernel_id, c.generated_kernel_id)
                                for c in self.choices.values() if c.generated_kernel_id))

    def fallback_counts(self) -> dict[tuple[str, str], int]:
        """(from_kernel, to_kernel) -> runtime fallbacks so far (a monotonic counter)."""
        with self._lock:
            return dict(Counter((f.from_kernel, f.to_kernel) for f in self.fallbacks))

    def decoder_layers(self) -> list[dict[str, object]]:
        """[{"index": i, "path": "fused" | "python", "reason": str | None}] per decoder
        layer; empty before a model is attached."""
        reasons = self.decoder_reasons() if self.decoder_reasons is not None else []
        return [{"index": i, "path": "fused" if r is None else "python", "reason": r}
                for i, r in enumerate(reasons)]

    def decoder_counts(self) -> dict[tuple[str, str], int]:
        """(path, reason or "") -> decoder layers."""
        return dict(Counter((str(d["path"]), str(d["reason"] or ""))
                            for d in self.decoder_layers()))

    def snapshot(self) -> dict[str, object]:
        with self._lock:
            snap: dict[str, object] = {
                "layers": [asdict(c) for c in self.choices.values()],
                "runtime_fallbacks": [asdict(f) for f in self.fallbacks],
            }
        snap["decoder_layers"] = self.decoder_layers()
        snap["attention"] = self.attention()
        snap["batch_invariant"] = self.batch_invariant()
        return snap

    def attention(self) -> dict[str, object] | None:
        """The model's attention path (PagedAttention.describe), None without a model."""
        return self.attention_state() if self.attention_state is not None else None

    def batch_invariant(self, catalog: KernelCatalog = DEFAULT_CATALOG) -> bool:
        """Whether every layer's kernel and the attention keep a row's bits whatever the
        batch (greedy answers the same alone and batched)."""
        attention = self.attention()
        return not _variant_kernels(self, catalog) and (
            attention is None or bool(attention["batch_invariant"]))


def forced_warnings(report: KernelReport) -> list[str]:
    """The startup log lines of the layers a forced kernel cannot run: one per distinct
    warning, with how many layers it concerns and the first of them (a kernel the host
    cannot run at all would otherwise log one line per layer; each layer's is in the
    report: /kernels, ``fp8serve kernels``)."""
    groups: dict[str, list[str]] = {}
    for choice in list(report.choices.values()):
        if choice.warning:
            groups.setdefault(choice.warning, []).append(choice.layer)
    return [f"{warning}: {len(layers)} layer{'s' if len(layers) > 1 else ''} "
            f"({layers[0]}{', ...' if len(layers) > 1 else ''})"
            for warning, layers in groups.items()]


def exactness_warning(report: KernelReport, overrides: KernelOverrides,
                      catalog: KernelCatalog = DEFAULT_CATALOG) -> str | None:
    """The startup log line when a layer runs a kernel that is not batch-invariant (a
    forced one, or the only one the host has) or attention runs on torch SDPA, else
    None."""
    ids = _variant_kernels(report, catalog)
    attention = report.attention()
    sdpa = attention is not None and not attention["batch_invariant"]
    if not ids and not sdpa:
        return None
    what = []
    if ids:
        forced = " (forced)" if any(overrides.forces(k) for k in ids) else ""
        what.append(f"{', '.join(ids)}{forced} is not batch-invariant")
    if sdpa:
        what.append(f"attention runs on torch SDPA ({attention['reason']}), whose "
                    "blocking follows the batch")
    return (f"exactness is off: {'; '.join(what)}, so a row's output may change with the "
            "other rows of its batch (greedy answers can differ alone and batched)")


def _variant_kernels(report: KernelReport, catalog: KernelCatalog) -> list[str]:
    """The kernels of the report's layers that are not batch-invariant, sorted."""
    from engine.kernels.bf16_linear import BF16_KERNELS, TORCH_KERNEL_ID

    def invariant(kernel_id: str) -> bool:  # bf16 linears: the C++ kernels, not torch_mm
        if kernel_id in BF16_KERNELS:
            return True
        return kernel_id != TORCH_KERNEL_ID and is_batch_invariant(kernel_id, catalog)

    ids = {k for c in report.choices.values()  # generated rows' kernels (AMX hosts) too
           for k in (c.kernel_id, c.generated_kernel_id) if k is not None}
    return sorted(k for k in ids if not invariant(k))


class LayerKernel:
    """Runs one FP8 linear layer: y[M, N] bf16 = x[M, K] bf16 @ W.T (+ bias).

    Rows by role: where the kernel names a ``generated_rows_kernel`` the registry pairs with
    it (registry.generated_kernel), the rows a call marks generated run on that kernel over
    the same packed weight, the others on the layer's kernel.

    If the chosen kernel fails to prepare the weight, or raises on its first call, the
    layer moves to the next kernel of its fallback chain (logged and recorded); once a
    call has succeeded, later errors propagate.

    Memory: only the packed weight is kept. ``weight`` is an Fp8Weight or a
    :class:`engine.memory.WeightSource` (e.g. the mapped q/k/v shards and how to fuse
    them); the layer keeps the source, builds the weight from it for each prepare, drops
    what it built and releases the source's mapped pages afterwards. A re-prepare after a
    runtime failure builds it again from the file.
    """

    def __init__(self, name: str, weight: Fp8Weight | WeightSource, hw: HardwareInfo,
                 overrides: KernelOverrides, report: KernelReport,
                 bias: torch.Tensor | None = None, platform: Platform | None = None,
                 catalog: KernelCatalog = DEFAULT_CATALOG) -> None:
        self.name = name
        self.source = WeightSource.of(weight)
        w = self.source.build()
        w.validate(name)
        self.n, self.k = w.n, w.k
        self.bias = bias  # fp32 [N] or None
        self._report = report
        spec = Fp8Spec.of(w, has_bias=bias is not None)
        platform = platform or platform_for(hw)
        sel = select_kernel(spec, hw, overrides, platform, catalog)
        if sel.warning:  # the runner logs them once, grouped (forced_warnings)
            log.debug("%s: %s", name, sel.warning)
        self.kernel: Fp8Kernel = sel.kernel
        self.generated_kernel: Fp8Kernel | None = sel.generated
        self._generated_verified = False
        self._chain = list(sel.fallbacks)
        self._verified = False
        report.record_choice(LayerChoice(
            name, self.kernel.id, platform.value, w.scale_kind.value, w.n, w.k,
            sel.rejections, sel.warning, sel.first_choice,
            sel.generated.id if sel.generated is not None else None,
        ))
        self.packed: PackedWeight = self._prepare_with_fallback(w)

    @property
    def weight(self) -> Fp8Weight:
        """The canonical weight, rebuilt from the source (not kept by the layer)."""
        return self.source.build()

    def _prepare_with_fallback(self, w: Fp8Weight | None = None) -> PackedWeight:
        w = self.source.build() if w is None else w
        try:
            while True:
                try:
                    return self.kernel.prepare(w)
                except Exception as exc:  # noqa: BLE001 - any packing failure: fallback
                    self._next_kernel(exc, "prepare")
        finally:
            del w
            self.source.release()

    def __call__(self, x: torch.Tensor, generated: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, K] bf16 -> [M, N] bf16. ``generated``: uint8 or bool [M], nonzero for a
        generated row (run on the generated-rows kernel, if the layer has one), or None."""
        if generated is not None and self.generated_kernel is not None and bool(generated.any()):
            return self._by_role(x, generated.bool())
        if self._verified:
            return self.kernel.apply(self.packed, x, self.bias)
        while True:
            try:
                y = self.kernel.apply(self.packed, x, self.bias)
                self._verified = True
                return y
            except Exception as exc:  # noqa: BLE001 - any kernel failure triggers fallback
                self._next_kernel(exc, "apply")
                self.packed = self._prepare_with_fallback()

    def _by_role(self, x: torch.Tensor, generated: torch.Tensor) -> torch.Tensor:
        """Prompt rows through __call__ (first-call fallback included), generated rows on
        the generated-rows kernel, which reads the same packed tensors."""
        y = torch.empty(x.shape[0], self.n, dtype=torch.bfloat16)
        rows_g = generated.nonzero().squeeze(1)
        rows_p = (~generated).nonzero().squeeze(1)
        if rows_p.numel():
            y.index_copy_(0, rows_p, self(x.index_select(0, rows_p)))
        y.index_copy_(0, rows_g, self._generated(x.index_select(0, rows_g)))
        return y

    def _generated(self, x: torch.Tensor) -> torch.Tensor:
        """Generated rows on the generated-rows kernel; if its first call fails (logged and
        recorded), on the layer's own kernel from then on, as when the prompt rows' call
        just fell back."""
        gen = self.generated_kernel
        if gen is None:
            return self(x)
        packed = replace(self.packed, kernel_id=gen.id)
        if self._generated_verified:
            return gen.apply(packed, x, self.bias)
        try:
            y = gen.apply(packed, x, self.bias)
        except Exception as exc:  # noqa: BLE001 - its first call failed: every row on one
            log.warning("%s: generated rows' kernel %s failed (%s: %s); every row runs %s",
                        self.name, gen.id, type(exc).__name__, exc, self.kernel.id)
            self._report.record_fallback(RuntimeFallback(
                self.name, gen.id, self.kernel.id, f"{type(exc).__name__}: {exc}",
                GENERATED_ROWS_STAGE))
            self.generated_kernel = None
            return self(x)
        self._generated_verified = True
        return y

    def _next_kernel(self, exc: Exception, stage: str) -> None:
        if not self._chain:
            raise NoKernelError(f"{self.name}: {self.kernel.id} failed ({stage}) and no "
                                f"fallback remains: {type(exc).__name__}: {exc}") from exc
        nxt = self._chain.pop(0)
        log.warning("%s: kernel %s failed on %s (%s: %s); falling back to %s",
                    self.name, self.kernel.id, stage, type(exc).__name__, exc, nxt.id)
        self._report.record_fallback(RuntimeFallback(
            self.name, self.kernel.id, nxt.id, f"{type(exc).__name__}: {exc}", stage))
        self.kernel = nxt
        self.generated_kernel = None  # it read the packing of the kernel that failed
