"""The in-process memory read-bandwidth probe of the benchmarks.

:class:`ReadProbe` owns one buffer (>= 1 GiB by default, allocated and written once, so
no sample pays page faults) and measures it two ways:

    read_xor   best of ``passes`` passes of ext read_xor: every torch thread XORs one
               slice of the buffer in an OpenMP team (AVX-512 or AVX2 loop, chosen by
               the extension's dispatch ISA; portable loop below AVX2). The XOR is
               checked against the buffer's known value, so a pass that skipped bytes
               would fail, not look fast.
    torch_sum  the former probe: best of ``passes`` torch sums of the same bytes viewed
               as fp32 (kept beside it for comparison; it reads 28-53 GB/s run to run
               on the shared development host).

Both in GB/s (1e9 bytes/s) of buffer bytes read. Samples are taken right before and
right after each timed phase (bench/generate/run.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import torch

# word i of the buffer is (i + 1) ^ MASK: the XOR of all n words is n (n % 4 == 0, as n is
# a multiple of 8), and every fp32 half is a normal number near 1 (no denormal slow path
# for the torch sum)
MASK = 0x3F80_0000_3F80_0000


@dataclass
class ReadProbe:
    nbytes: int = 1 << 30
    passes: int = 5
    buf: torch.Tensor = field(init=False, repr=False)  # int64 [nbytes / 8], see MASK

    def __post_init__(self) -> None:
        if self.nbytes < 64 or self.nbytes % 64 or self.passes < 1:
            raise ValueError(f"ReadProbe: nbytes must be a positive multiple of 64 and "
                             f"passes >= 1, got {self.nbytes}, {self.passes}")
        n = self.nbytes // 8
        self.buf = torch.arange(1, n + 1, dtype=torch.int64).bitwise_xor_(MASK)

    @property
    def expected_xor(self) -> int:
        """XOR of all words: XOR of 1..n is n when n % 4 == 0; MASK cancels (n even)."""
        return self.nbytes // 8

    def read_xor_gbps(self) -> float | None:
        """Best pass of the extension's read_xor; None without the extension."""
        import ext

        if not ext.load().built or not hasattr(ext.ops(), "read_xor"):
            return None
        best = float("inf")
        for _ in range(self.passes):
            t0 = time.perf_counter()
            got = ext.read_xor(self.buf)
            best = min(best, time.perf_counter() - t0)
            if got != self.expected_xor:
                raise RuntimeError(f"read_xor returned {got:#x}, expected "
                                   f"{self.expected_xor:#x}: the probe did not read the buffer")
        return self.nbytes / best / 1e9

    def torch_sum_gbps(self) -> float:
        """Best pass of a torch fp32 sum over the same bytes (the former probe)."""
        view = self.buf.view(torch.float32)
        best = float("inf")
        for _ in range(self.passes):
            t0 = time.perf_counter()
            view.sum()
            best = min(best, time.perf_counter() - t0)
        return self.nbytes / best / 1e9

    def sample(self, label: str) -> dict[str, Any]:
        """{"label", "read_xor_gbps" (None without the extension), "torch_sum_gbps"}."""
        return {"label": label, "read_xor_gbps": self.read_xor_gbps(),
                "torch_sum_gbps": self.torch_sum_gbps()}


def best_of(samples: list[dict[str, Any]], key: str) -> float | None:
    """The highest non-None ``key`` over ``samples`` (None when there is none)."""
    vals = [s[key] for s in samples if s.get(key) is not None]
    return max(vals) if vals else None
