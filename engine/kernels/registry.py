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
"""

from __future__ import annotations

import importlib
import os
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from engine.hardware import HardwareInfo
from engine.kernels.base import Fp8Kernel, Fp8Spec, Platform, ScaleKind

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


def _split_ids(ids: str | Iterable[str] | None) -> frozenset[str]:
    if ids is None:
        return frozenset()
    items = [ids] if isinstance(ids, str) else list(ids)
    return frozenset(k.strip() for item in items for k in item.split(",") if k.strip())


@dataclass(frozen=True, slots=True)
class KernelOverrides:
    forced: str | None = None  # FP8SERVE_KERNEL / --kernel: an FP8 table's kernel
    disabled: frozenset[str] = frozenset()  # FP8SERVE_DISABLED_KERNELS / --disable-kernel
    forced_bf16: str | None = None  # the same flag's bf16 kernel (BF16_KERNEL_IDS)

    def __post_init__(self) -> None:
        unknown = ({self.forced} if self.forced else set()) | set(self.disabled)
        unknown -= set(KNOWN_IDS)
        if unknown:
            raise ValueError(
                f"unknown kernel id(s) {sorted(unknown)}; known: {sorted(KNOWN_IDS)}"
            )
        if self.forced in BF16_KERNEL_IDS or (
                self.forced_bf16 is not None and self.forced_bf16 not in BF16_KERNEL_IDS):
            raise ValueError(f"forced {self.forced!r} / forced_bf16 {self.forced_bf16!r}: "
                             f"bf16 kernels ({', '.join(BF16_KERNEL_IDS)}) are forced_bf16")

    def forces(self, kernel_id: str) -> bool:
        return kernel_id in (self.forced, self.forced_bf16)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> KernelOverrides:
        return overrides_from(None, None, env)

    def to_dict(self) -> dict[str, object]:
        return {"forced": self.forced, "disabled": sorted(self.disabled),
                "forced_bf16": self.forced_bf16}


NO_OVERRIDES = KernelOverrides()


def overrides_from(kernel: str | None, disabled: str | Iterable[str] | None,
                   env: Mapping[str, str] | None = None) -> KernelOverrides:
    """Operator overrides from CLI/config values and the environment.

    ``kernel`` (``--kernel``) replaces FP8SERVE_KERNEL when given: one id, or two
    comma-separated, at most one of an FP8 table and one bf16 kernel (BF16_KERNEL_IDS).
    ``disabled`` (``--disable-kernel``, comma lists allowed) adds to
    FP8SERVE_DISABLED_KERNELS. Raises ValueError naming any unknown kernel id and where it
    was given (the flag or the environment variable)."""
    env = os.environ if env is None else env
    flag_forced = (kernel or "").strip()
    env_forced = (env.get(ENV_FORCED) or "").strip()
    source = f"--kernel {flag_forced}" if flag_forced else f"{ENV_FORCED}={env_forced}"
    fp8, bf16 = _split_forced(flag_forced or env_forced, source)
    env_off, flag_off = _split_ids(env.get(ENV_DISABLED)), _split_ids(disabled)
    _check_known(env_off, f"{ENV_DISABLED}={env.get(ENV_DISABLED)}")
    _check_known(flag_off, f"--disable-kernel {','.join(sorted(flag_off))}")
    return KernelOverrides(fp8, env_off | flag_off, bf16)


def _split_forced(value: str, source: str) -> tuple[str | None, str | None]:
    """(the FP8 kernel, the bf16 kernel) a --kernel / FP8SERVE_KERNEL value forces."""
    ids = [k.strip() for k in value.split(",") if k.strip()]
    _check_known(set(ids), source)
    fp8 = [k for k in ids if k not in BF16_KERNEL_IDS]
    bf16 = [k for k in ids if k in BF16_KERNEL_IDS]
    if len(fp8) > 1 or len(bf16) > 1:
        raise ValueError(f"{source}: at most one FP8 kernel and one bf16 kernel "
                         f"({', '.join(BF16_KERNEL_IDS)}) may be forced")
    return (fp8[0] if fp8 else None), (bf16[0] if bf16 else None)


def _check_known(ids: Iterable[str], source: str) -> None:
    unknown = sorted(set(ids) - set(KNOWN_IDS))
    if unknown:
        raise ValueError(f"{source}: unknown kernel id(s) {', '.join(unknown)}; known: "
                         f"{', '.join(sorted(KNOWN_IDS))}")


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


KernelFactory = Callable[[], Fp8Kernel]


def _import_factory(target: str) -> KernelFactory:
    module_name, cls_name = target.split(":")
    return getattr(importlib.import_module(module_name), cls_name)  # type: ignore[no-any-return]


@dataclass(frozen=True, slots=True)
class _Loaded:
    kernel: Fp8Kernel | None
    error: str | None = None


@dataclass(frozen=True)
class KernelCatalog:
    """Which kernels exist (id -> "module:Class" or a factory) and the priority tables.

    Each kernel is instantiated at most once per catalog (kernels are stateless; the cache
    lives on the catalog object, so a test's catalog never sees another's kernels)."""

    kernels: Mapping[str, str | KernelFactory] = field(
        default_factory=lambda: dict(KERNEL_CLASSES))
    priority: Mapping[tuple[Platform, ScaleKind], tuple[str, ...]] = field(
        default_factory=lambda: dict(PRIORITY))
    _cache: dict[str, _Loaded] = field(default_factory=dict, repr=False, compare=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def load(self, kernel_id: str) -> _Loaded:
        with self._lock:
            if kernel_id not in self._cache:
                self._cache[kernel_id] = self._instantiate(kernel_id)
            return self._cache[kernel_id]

    def _instantiate(self, kernel_id: str) -> _Loaded:
        target = self.kernels.get(kernel_id)
        if target is None:
            return _Loaded(None, "not in this build's kernel catalog")
        try:
            factory = _import_factory(target) if isinstance(target, str) else target
            return _Loaded(factory())
        except Exception as exc:  # noqa: BLE001 - any import/constructor failure is a reason
            return _Loaded(None, f"kernel module unavailable: {type(exc).__name__}: {exc}")

    def table(self, platform: Platform, kind: ScaleKind) -> tuple[str, ...]:
        return tuple(self.priority.get((platform, kind), ()))


DEFAULT_CATALOG = KernelCatalog()


def get_kernel(kernel_id: str, catalog: KernelCatalog = DEFAULT_CATALOG) -> Fp8Kernel:
    loaded = catalog.load(kernel_id)
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
    every row), the operator left it enabled, this host runs it, and it and ``kernel`` are
    batch-invariant; else None. Shapes play no part (generated_kernel checks them)."""
    kid = kernel.generated_rows_kernel
    if kid is None or overrides.forced or not kernel.batch_invariant:
        return None
    if kid in overrides.disabled or hardware_reason(kid, hw, catalog) is not None:
        return None
    return kid if is_batch_invariant(kid, catalog) else None


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


