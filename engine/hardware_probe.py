"""Probe this host once and return an immutable :class:`HardwareInfo`.

Sources, each injectable so tests never depend on the machine they run on:

* CPU features: the C++ extension's cpuid probe (``ext.cpuid_features()``) when the
  extension loads, else the ``flags`` line of /proc/cpuinfo (Linux names, see
  ``engine.hardware.CPU_FEATURES``). Non-x86 hosts report no x86 features.
* AMX: counts only when the tile unit exists *and* Linux grants the tile-data state:
  ``ext.request_amx_permission()`` when offered, else
  ``syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)`` through ctypes,
  confirmed with ``ARCH_GET_XCOMP_PERM``.
* XPU / CUDA: ``torch.xpu.is_available()`` (guarded by hasattr) and
  ``torch.cuda.is_available()`` with the device capability.
* Extension build status: ``ext.load() -> ExtensionStatus`` (never raises).

The probe keeps no state: callers probe once per process and pass the result along.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
from collections.abc import Callable
from types import ModuleType
from typing import Any

from engine.hardware import CPU_FEATURES, ExtensionStatus, HardwareInfo, isa_env_problem

SYS_ARCH_PRCTL = 158  # x86_64
ARCH_GET_XCOMP_PERM = 0x1022
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18

X86_MACHINES = ("x86_64", "amd64", "i386", "i686")


def parse_cpuinfo(text: str) -> tuple[str, frozenset[str]]:
    """/proc/cpuinfo text -> (model name, the CPU_FEATURES named in its first flags line).

    ARM's "Features" line is read too; it names none of the x86 features, so an ARM host
    gets an empty set."""
    model, flags = "unknown", frozenset[str]()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip().lower()
        if key in ("model name", "hardware", "cpu model") and model == "unknown":
            model = value.strip() or model
        elif key in ("flags", "features") and not flags:
            flags = frozenset(value.split()) & frozenset(CPU_FEATURES)
    return model, flags


def _read_cpuinfo() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def request_amx_permission_ctypes() -> bool:
    """Ask Linux for the AMX tile-data state for this process; True when granted."""
    if platform.system() != "Linux" or platform.machine().lower() not in X86_MACHINES:
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
        bitmask = ctypes.c_ulong(0)
        if libc.syscall(SYS_ARCH_PRCTL, ARCH_GET_XCOMP_PERM, ctypes.byref(bitmask)) != 0:
            return False
        return bool(bitmask.value & (1 << XFEATURE_XTILEDATA))
    except (OSError, AttributeError):
        return False


def _import_ext() -> ModuleType | None:
    try:
        import ext  # the C++ extension package (ext/__init__.py)
    except Exception:  # noqa: BLE001 - a broken or missing ext must not stop the probe
        return None
    return ext


def extension_status(ext: Any | None) -> ExtensionStatus:
    if ext is None or not hasattr(ext, "load"):
        return ExtensionStatus(built=False, error="extension package ext is not importable")
    try:
        status = ext.load()
    except Exception as exc:  # noqa: BLE001 - ext.load() should not raise; be safe anyway
        return ExtensionStatus(built=False, error=f"ext.load() raised {type(exc).__name__}: {exc}")
    if isinstance(status, ExtensionStatus):
        return status
    return ExtensionStatus(built=bool(getattr(status, "built", False)),
                           error=getattr(status, "error", None))


def _cpu_flags(ext: Any | None, ext_built: bool, cpuinfo_flags: frozenset[str],
               machine: str) -> frozenset[str]:
    if machine.lower() not in X86_MACHINES:
        return frozenset()
    if ext is not None and ext_built and hasattr(ext, "cpuid_features"):
        try:
            return frozenset(ext.cpuid_features()) & frozenset(CPU_FEATURES)
        except Exception:  # noqa: BLE001 - fall back to /proc/cpuinfo
            pass
    return cpuinfo_flags


def _dispatch_isa(ext: Any | None, ext_built: bool) -> str | None:
    if ext is None or not ext_built or not hasattr(ext, "isa"):
        return None
    try:
        return str(ext.isa())
    except Exception:  # noqa: BLE001 - unknown level: no dispatch restriction applied
        return None


def _amx_permitted(flags: frozenset[str], ext: Any | None, ext_built: bool,
                   request: Callable[[], bool]) -> bool:
    if "amx_tile" not in flags:
        return False
    if ext is not None and ext_built and hasattr(ext, "request_amx_permission"):
        try:
            return bool(ext.request_amx_permission())
        except Exception:  # noqa: BLE001 - fall back to the ctypes request
            pass
    return request()


def _accelerators(torch_mod: Any) -> dict[str, object]:
    out: dict[str, object] = {}
    xpu: Any = getattr(torch_mod, "xpu", None)
    try:
        out["xpu_available"] = bool(xpu is not None and xpu.is_available())
        if out["xpu_available"]:
            out["xpu_name"] = str(xpu.get_device_name(0))
    except Exception:  # noqa: BLE001 - a broken XPU runtime means no XPU
        out["xpu_available"] = False
    cuda: Any = getattr(torch_mod, "cuda", None)
    try:
        out["cuda_available"] = bool(cuda is not None and cuda.is_available())
        if out["cuda_available"]:
            major, minor = cuda.get_device_capability(0)
            out["cuda_capability"] = (int(major), int(minor))
            out["cuda_name"] = str(cuda.get_device_name(0))
    except Exception:  # noqa: BLE001 - a broken CUDA runtime means no CUDA
        out["cuda_available"] = False
    return out


def _usable_cpus() -> int:
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


_UNSET: Any = object()


def probe_hardware(
    *,
    ext: Any = _UNSET,
    cpuinfo_text: str | None = None,
    machine: str | None = None,
    torch_mod: Any = None,
    amx_request: Callable[[], bool] = request_amx_permission_ctypes,
    num_cpus: int | None = None,
) -> HardwareInfo:
    """Probe the host. Every argument replaces one source (tests pass fakes):
    ``ext`` the extension module (None: no extension), ``cpuinfo_text`` the
    /proc/cpuinfo contents, ``machine`` platform.machine(), ``torch_mod`` the torch
    module, ``amx_request`` the AMX permission request, ``num_cpus`` the core count.
    An FP8SERVE_ISA that names no dispatch level raises ValueError naming the levels."""
    problem = isa_env_problem(os.environ.get("FP8SERVE_ISA"))
    if problem is not None:
        raise ValueError(problem)
    if ext is _UNSET:
        ext = _import_ext()
    if torch_mod is None:
        import torch as torch_mod
    machine = machine or platform.machine()
    model, info_flags = parse_cpuinfo(_read_cpuinfo() if cpuinfo_text is None else cpuinfo_text)
    status = extension_status(ext)
    flags = _cpu_flags(ext, status.built, info_flags, machine)
    return HardwareInfo(
        machine=machine,
        cpu_model=model,
        cpu_flags=flags,
        amx_permitted=_amx_permitted(flags, ext, status.built, amx_request),
        num_cpus=num_cpus or _usable_cpus(),
        extension=status,
        dispatch_isa=_dispatch_isa(ext, status.built),
        **_accelerators(torch_mod),  # type: ignore[arg-type]
    )
