"""Timing primitives shared by the benchmarks: call timing, the memory read bandwidth of
this process, and the last-level cache size (to size weight rotation)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

DEFAULT_LLC_BYTES = 64 << 20  # when /sys does not say


def time_calls(fns: list[Callable[[], object]], reps: int, warmup: int = 1) -> float:
    """Median seconds per call, cycling through ``fns`` (one per distinct weight, so a
    rotation larger than the cache measures memory, not cache, bandwidth)."""
    for i in range(warmup):
        fns[i % len(fns)]()
    samples = []
    for i in range(max(1, reps)):
        fn = fns[i % len(fns)]
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def measure_read_bandwidth(nbytes: int = 1 << 30, reps: int = 5) -> float:
    """Read bandwidth in GB/s (1e9 bytes/s): best of ``reps`` sums over one float32
    buffer of ``nbytes`` (allocated and touched once, then only read)."""
    buf = torch.ones(max(1, nbytes // 4), dtype=torch.float32)
    buf.sum()  # fault the pages in
    best = min(_timed(buf.sum) for _ in range(max(1, reps)))
    return buf.numel() * 4 / best / 1e9


def _timed(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def llc_bytes(sys_cpu: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """The largest cache level's size from sysfs (e.g. "32768K"), or a 64 MiB default."""
    best = 0
    for size_file in sys_cpu.glob("index*/size"):
        try:
            text = size_file.read_text().strip().upper()
        except OSError:
            continue
        mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        if digits.isdigit():
            best = max(best, int(digits) * mult)
    return best or DEFAULT_LLC_BYTES


def copies_to_exceed(nbytes: int, cache_bytes: int, factor: float = 2.0,
                     max_copies: int = 64) -> int:
    """How many distinct weights of ``nbytes`` together exceed ``factor`` x the cache."""
    return max(2, min(max_copies, int(factor * cache_bytes // max(1, nbytes)) + 1))
