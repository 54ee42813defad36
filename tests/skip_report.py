"""The closing summary of which skips are for hardware this host lacks and which are not.

A CI log then says what did not run: ``hardware skips: N`` counts the tests that need an
ISA, accelerator or grant the host lacks (AVX-512, AMX, CUDA, ...); every other skip is
listed with its reason.
"""

from __future__ import annotations

import re
from collections import Counter

# Reasons the hardware markers and probes give (tests/ext/support.py, tests/kernels/...).
HARDWARE = re.compile(
    r"host CPU lacks|host lacks|no granted AMX|CUDA device|FP8 tensor cores|from the real CPU"
    r"|already runs the portable kernel|dispatch is \w+: the in-process tests")


def skip_reason(report) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def is_hardware(reason: str) -> bool:
    return HARDWARE.search(reason) is not None


def summarize(skipped: list) -> tuple[int, Counter]:
    """(hardware skip count, Counter of the other reasons)."""
    reasons = [skip_reason(r) for r in skipped]
    other = Counter(r for r in reasons if not is_hardware(r))
    return len(reasons) - sum(other.values()), other


def terminal_summary(terminalreporter, config) -> None:
    hardware, other = summarize(terminalreporter.stats.get("skipped", []))
    terminalreporter.write_sep("-", "skips")
    terminalreporter.write_line(f"hardware skips: {hardware} (tests for an ISA or device "
                                f"this host lacks); other skips: {sum(other.values())}")
    for reason, n in other.most_common():
        terminalreporter.write_line(f"  not hardware: {n} x {reason}")
