"""CPU feature probe and the Linux AMX permission request.

:func:`cpuid_features` asks the extension's cpuid op (cpuid bits plus the OS XSAVE/XCR0
state checks); when the extension is not built it falls back to the Linux
``/proc/cpuinfo`` flags (the kernel lists only features whose state it saves).
:func:`request_amx_permission` is done here in Python with ctypes: it needs no compiled
code, so it works even when the extension failed to build.
"""

from __future__ import annotations

import ctypes
import platform
from pathlib import Path

from engine.hardware import CPU_FEATURES

SYS_ARCH_PRCTL = 158  # x86_64
ARCH_REQ_XCOMP_PERM = 0x1023
XFEATURE_XTILEDATA = 18


def cpuinfo_flags(path: Path = Path("/proc/cpuinfo")) -> frozenset[str]:
    """The CPU_FEATURES named in the first ``flags`` line of /proc/cpuinfo."""
    try:
        text = path.read_text()
    except OSError:
        return frozenset()
    for line in text.splitlines():
        if line.startswith("flags"):
            return frozenset(line.split(":", 1)[1].split()) & frozenset(CPU_FEATURES)
    return frozenset()


def request_amx_permission() -> bool:
    """arch_prctl(ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA); True when granted. Never raises.

    Without it, the first AMX tile instruction in this process faults (SIGILL)."""
    if platform.system() != "Linux" or platform.machine() not in ("x86_64", "AMD64"):
        return False
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        rc = libc.syscall(SYS_ARCH_PRCTL, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA)
    except (OSError, AttributeError):
        return False
    return rc == 0
