"""Per-layer selection: for a layer's :class:`Fp8Spec` on a host, the first kernel of the
platform's table in trial order (batch-invariant kernels first, a forced one ahead of all)
that is enabled, supported and can implement the spec, every kernel passed over as a
:class:`Rejection` with its reason, the later usable ones as the runtime-fallback chain,
and the kernel of the layer's generated rows."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from engine.hardware import HardwareInfo
from engine.kernels.base import Fp8Kernel, Fp8Spec, Platform, ScaleKind
from engine.kernels.registry.catalog import DEFAULT_CATALOG, KernelCatalog, get_kernel
from engine.kernels.registry.overrides import KernelOverrides
from engine.kernels.registry.tables import DISABLED_REASON, NoKernelError


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
    # The kernel this layer gets when it can implement it (see first_choice): a winner
    # other than this one is a startup fallback.
    first_choice: str | None = None
    # The kernel of the layer's generated rows (Fp8Kernel.generated_rows_kernel), or None
    generated: Fp8Kernel | None = None


def platform_for(hw: HardwareInfo) -> Platform:
    """The platform the model runs on: XPU, then CUDA, then CPU."""
    if hw.xpu_available:
        return Platform.XPU
    if hw.cuda_available:
        return Platform.CUDA
    return Platform.CPU


def is_batch_invariant(kernel_id: str, catalog: KernelCatalog = DEFAULT_CATALOG) -> bool:
    """The kernel's ``batch_invariant`` flag; False for a kernel that does not load."""
    loaded = catalog.load(kernel_id)
    return loaded.kernel is not None and bool(loaded.kernel.batch_invariant)


def trial_order(platform: Platform, kind: ScaleKind,
                catalog: KernelCatalog = DEFAULT_CATALOG) -> tuple[str, ...]:
    """The table with its batch-invariant kernels moved ahead of the others (each group
    in table order)."""
    table = catalog.table(platform, kind)
    return tuple(sorted(table, key=lambda k: not is_batch_invariant(k, catalog)))


def candidate_ids(platform: Platform, kind: ScaleKind, overrides: KernelOverrides,
                  catalog: KernelCatalog = DEFAULT_CATALOG) -> list[str]:
    """The table in trial order (forced kernel first), disabled kernels still listed."""
    table = list(trial_order(platform, kind, catalog))
    if overrides.forced:
        table = [overrides.forced] + [k for k in table if k != overrides.forced]
    return table


def _guarded(what: str, fn: Callable[[], str | None]) -> str | None:
    try:
        return fn()
    except Exception as exc:  # noqa: BLE001 - a raising check rejects, never crashes
        return f"{what} raised {type(exc).__name__}: {exc}"


def hardware_reason(kernel_id: str, hw: HardwareInfo, catalog: KernelCatalog) -> str | None:
    """Why this host cannot run the kernel (import failure or is_supported), or None."""
    loaded = catalog.load(kernel_id)
    if loaded.kernel is None:
        return loaded.error
    kernel = loaded.kernel
    return _guarded("is_supported", lambda: kernel.is_supported(hw))


def reject_reason(kernel_id: str, spec: Fp8Spec, hw: HardwareInfo,
                  overrides: KernelOverrides, catalog: KernelCatalog) -> str | None:
    if kernel_id in overrides.disabled:
        return DISABLED_REASON
    reason = hardware_reason(kernel_id, hw, catalog)
    if reason is not None:
        return reason
    kernel = get_kernel(kernel_id, catalog)
    return _guarded("can_implement", lambda: kernel.can_implement(spec))


def _forced_warning(overrides: KernelOverrides, winner: str,
                    rejections: list[Rejection]) -> str | None:
    if not overrides.forced or winner == overrides.forced:
        return None
    reason = next((r.reason for r in rejections if r.kernel_id == overrides.forced),
                  "not in table")
    return f"forced kernel {overrides.forced} cannot run this layer ({reason}); using {winner}"


def first_choice(platform: Platform, kind: ScaleKind, hw: HardwareInfo,
                 overrides: KernelOverrides = KernelOverrides(),
                 catalog: KernelCatalog = DEFAULT_CATALOG) -> str | None:
    """The forced kernel, else the first table entry the operator left enabled and the
    host runs (is_supported); None when there is none. Layer shapes play no part: a
    layer that gets another kernel fell back at startup."""
    if overrides.forced:
        return overrides.forced
    return next((k for k in trial_order(platform, kind, catalog) if k not in overrides.disabled
                 and hardware_reason(k, hw, catalog) is None), None)


def select_kernel(
    spec: Fp8Spec,
    hw: HardwareInfo,
    overrides: KernelOverrides = KernelOverrides(),
    platform: Platform | None = None,
    catalog: KernelCatalog = DEFAULT_CATALOG,
) -> Selection:
    """The first usable kernel for ``spec``, the reasons the earlier ones were passed
    over, and the later usable ones as a runtime-fallback chain."""
    platform = platform or platform_for(hw)
    rejections: list[Rejection] = []
    ok: list[Fp8Kernel] = []
    for kid in candidate_ids(platform, spec.scale_kind, overrides, catalog):
        reason = reject_reason(kid, spec, hw, overrides, catalog)
        if reason is None:
            ok.append(get_kernel(kid, catalog))
        elif not ok:
            rejections.append(Rejection(kid, reason))
    if not ok:
        detail = "; ".join(f"{r.kernel_id}: {r.reason}" for r in rejections) or "empty table"
        raise NoKernelError(
            f"no {platform.value} kernel for {spec.scale_kind.value} [N={spec.n}, K={spec.k}]: "
            f"{detail}"
        )
    warning = _forced_warning(overrides, ok[0].id, rejections)
    return Selection(ok[0], tuple(rejections), tuple(ok[1:]), warning,
                     first_choice(platform, spec.scale_kind, hw, overrides, catalog),
                     generated_kernel(ok[0], spec, hw, overrides, catalog))


def generated_kernel(kernel: Fp8Kernel, spec: Fp8Spec, hw: HardwareInfo,
                     overrides: KernelOverrides = KernelOverrides(),
                     catalog: KernelCatalog = DEFAULT_CATALOG) -> Fp8Kernel | None:
    """The kernel ``kernel``'s layer runs its generated rows on (:func:`generated_id`, when
    it also implements ``spec``); else None (every row on ``kernel``)."""
    kid = generated_id(kernel, hw, overrides, catalog)
    if kid is None:
        return None
    gen = get_kernel(kid, catalog)
    return gen if _guarded("can_implement", lambda: gen.can_implement(spec)) is None else None


def generated_id(kernel: Fp8Kernel, hw: HardwareInfo, overrides: KernelOverrides,
                 catalog: KernelCatalog) -> str | None:
    """``kernel``'s ``generated_rows_kernel`` when no kernel is forced (a forced kernel runs
    every row), rows by role are not off (``overrides.rows_by_role`` False), the operator
    left it enabled, this host runs it, and it and ``kernel`` are batch-invariant; else
    None. Shapes play no part (generated_kernel checks them)."""
    kid = kernel.generated_rows_kernel
    if (kid is None or overrides.forced or overrides.rows_by_role is False
            or not kernel.batch_invariant):
        return None
    if kid in overrides.disabled or hardware_reason(kid, hw, catalog) is not None:
        return None
    return kid if is_batch_invariant(kid, catalog) else None
