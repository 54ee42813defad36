"""Every priority table as this host sees it (:class:`TableInfo`, one :class:`TableEntry`
per kernel: supported or not and why, forced, disabled, batch-invariant, its generated-rows
kernel), in trial order: what `fp8serve kernels` and /kernels show."""

from __future__ import annotations

from dataclasses import dataclass

from engine.hardware import HardwareInfo
from engine.kernels.registry.catalog import DEFAULT_CATALOG, KernelCatalog
from engine.kernels.registry.overrides import KernelOverrides
from engine.kernels.registry.selection import (
    generated_id,
    hardware_reason,
    is_batch_invariant,
    platform_for,
    trial_order,
)
from engine.kernels.registry.tables import DISABLED_REASON


@dataclass(frozen=True, slots=True)
class TableEntry:
    kernel_id: str
    supported: bool  # the hardware can run it and the operator did not disable it
    reason: str | None  # why not, when not supported
    forced: bool = False
    disabled: bool = False
    batch_invariant: bool = False  # rows bitwise independent of the batch (Fp8Kernel)
    # registry.generated_kernel for the table's layers on this host (spec-independent
    # checks only), else None
    generated_rows_kernel: str | None = None


@dataclass(frozen=True, slots=True)
class TableInfo:
    platform: str
    scale_kind: str
    active: bool  # this host's platform
    entries: tuple[TableEntry, ...]

    @property
    def name(self) -> str:
        return f"{self.platform}/{self.scale_kind}"


def _table_generated(kernel_id: str, hw: HardwareInfo, overrides: KernelOverrides,
                     catalog: KernelCatalog) -> str | None:
    loaded = catalog.load(kernel_id)
    return None if loaded.kernel is None else generated_id(loaded.kernel, hw, overrides,
                                                            catalog)


def table_infos(hw: HardwareInfo, overrides: KernelOverrides = KernelOverrides(),
                catalog: KernelCatalog = DEFAULT_CATALOG) -> list[TableInfo]:
    """Every table in trial order, every kernel, supported or not and why: for
    `fp8serve kernels` and /kernels."""
    active = platform_for(hw)
    out = []
    for platform, kind in catalog.priority:
        entries = []
        for kid in trial_order(platform, kind, catalog):
            off = kid in overrides.disabled
            reason = DISABLED_REASON if off else hardware_reason(kid, hw, catalog)
            entries.append(TableEntry(kid, reason is None, reason,
                                      forced=kid == overrides.forced, disabled=off,
                                      batch_invariant=is_batch_invariant(kid, catalog),
                                      generated_rows_kernel=_table_generated(
                                          kid, hw, overrides, catalog)))
        out.append(TableInfo(platform.value, kind.value, platform is active, tuple(entries)))
    return out
