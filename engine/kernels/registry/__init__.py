"""Priority-ordered kernel tables and per-layer selection.

For a layer (an :class:`Fp8Spec`) on a host (:class:`HardwareInfo`), the chosen kernel is
the first entry of the platform's table for that scale kind that is not disabled, is
supported by the hardware and can implement the spec. The tables are tried with their
batch-invariant kernels first (:func:`trial_order`): a kernel whose rows depend on the
batch is never chosen ahead of one whose rows do not, unless it is forced. Every kernel
passed over is recorded as a :class:`Rejection` with its reason. A forced kernel
(FP8SERVE_KERNEL) goes first; a layer it cannot implement falls back down the table with a
warning, never an error.

Kernels come from a :class:`KernelCatalog` (id -> kernel factory, plus the tables). The
default catalog imports kernel modules lazily, so a kernel whose module fails to import
(a missing optional dependency, a broken extension) is rejected with that reason instead
of crashing the process. Tests pass their own catalog with fake kernels.

The modules: ``tables`` (ids and priority tables), ``overrides``, ``catalog``,
``selection``, ``table_info``; their public names are re-exported here.
"""

from __future__ import annotations

from engine.kernels.registry.catalog import (
    DEFAULT_CATALOG,
    KernelCatalog,
    KernelFactory,
    get_kernel,
)
from engine.kernels.registry.overrides import (
    NO_OVERRIDES,
    KernelOverrides,
    overrides_from,
)
from engine.kernels.registry.selection import (
    Rejection,
    Selection,
    candidate_ids,
    first_choice,
    generated_id,
    generated_kernel,
    hardware_reason,
    is_batch_invariant,
    platform_for,
    reject_reason,
    select_kernel,
    trial_order,
)
from engine.kernels.registry.table_info import (
    TableEntry,
    TableInfo,
    table_infos,
)
from engine.kernels.registry.tables import (
    BF16_KERNEL_IDS,
    DISABLED_REASON,
    ENV_DISABLED,
    ENV_FORCED,
    KERNEL_CLASSES,
    KNOWN_IDS,
    PRIORITY,
    NoKernelError,
)

__all__ = [
    "BF16_KERNEL_IDS",
    "DEFAULT_CATALOG",
    "DISABLED_REASON",
    "ENV_DISABLED",
    "ENV_FORCED",
    "KERNEL_CLASSES",
    "KNOWN_IDS",
    "KernelCatalog",
    "KernelFactory",
    "KernelOverrides",
    "NO_OVERRIDES",
    "NoKernelError",
    "PRIORITY",
    "Rejection",
    "Selection",
    "TableEntry",
    "TableInfo",
    "candidate_ids",
    "first_choice",
    "generated_id",
    "generated_kernel",
    "get_kernel",
    "hardware_reason",
    "is_batch_invariant",
    "overrides_from",
    "platform_for",
    "reject_reason",
    "select_kernel",
    "table_infos",
    "trial_order",
]
