"""The :class:`KernelCatalog`: which kernels exist (id -> "module:Class" or a factory) and
the tables, each kernel instantiated at most once per catalog, a kernel whose module fails
to import or construct held as the reason it cannot run; ``get_kernel`` raises that reason
as :class:`NoKernelError`."""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from engine.kernels.base import Fp8Kernel, Platform, ScaleKind
from engine.kernels.registry.tables import KERNEL_CLASSES, PRIORITY, NoKernelError

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
