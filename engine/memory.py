"""Resident memory of memory-mapped checkpoint tensors, and where a layer's weight comes
from when it has to be prepared again.

Checkpoint tensors (engine/checkpoint/tensors.py) live in a private, read-only-in-practice
mapping of the safetensors file (``rw-p``, file-backed). Reading one faults its pages in,
and they stay resident (``RssFile``) for as long as the mapping exists, even after the
weight has been packed into its kernel's own buffer. :func:`release_pages` hands those
pages back with ``madvise(MADV_DONTNEED)``: for clean pages of a private file mapping that
is lossless, a later read faults them in again from the file.

    release_pages(t)     t: any tensor; only whole pages inside [data_ptr, +nbytes) that
                         lie in a private file mapping are released -> bytes released
    WeightSource         the mapped shards of one FP8 linear (+ how to combine them):
                         build() -> Fp8Weight, release() -> bytes released
    trim_heap()          give free malloc heap pages back to the OS (glibc malloc_trim):
                         the fused copies made while packing leave holes in the heap
    retain_heap(nbytes)  from then on, keep freed step buffers in the heap instead of
                         unmapping them (glibc mallopt), so steps stop page-faulting

Never call :func:`release_pages` on a mapped tensor that was written in place (its pages
are then private anonymous copies and would be lost); nothing in the engine writes to
checkpoint tensors.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine.kernels.base import Fp8Weight

MADV_DONTNEED = 4  # linux/mman.h
PAGE = mmap.PAGESIZE


@dataclass(frozen=True, slots=True)
class Mapping:
    """One line of /proc/self/maps."""

    start: int
    end: int
    perms: str  # e.g. "rw-p"
    inode: int
    path: str

    @property
    def private_file(self) -> bool:
        return self.perms.endswith("p") and self.inode != 0 and self.path.startswith("/")


def _parse(line: str) -> Mapping:
    parts = line.split(maxsplit=5)
    lo, hi = parts[0].split("-")
    path = parts[5].strip() if len(parts) > 5 else ""
    return Mapping(int(lo, 16), int(hi, 16), parts[1], int(parts[4]), path)


def mapping_of(addr: int, maps_path: str = "/proc/self/maps") -> Mapping | None:
    """The mapping of this process that contains ``addr``, or None."""
    try:
        with open(maps_path) as fh:
            for line in fh:
                m = _parse(line)
                if m.start <= addr < m.end:
                    return m
    except OSError:
        return None
    return None


_libc: ctypes.CDLL | None = None


def _c_function(name: str, argtypes: tuple[type, ...]) -> Any:
    """The C library's function ``name`` with its argument types set, or None where the
    library or the function is missing (e.g. malloc_trim and mallopt on musl)."""
    global _libc
    try:
        if _libc is None:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        fn = getattr(_libc, name)
    except (OSError, AttributeError):
        return None
    fn.argtypes = argtypes
    return fn


def _madvise(start: int, length: int, advice: int) -> None:
    madvise = _c_function("madvise", (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int))
    if madvise is None:
        raise OSError("the C library has no madvise")
    if madvise(ctypes.c_void_p(start), ctypes.c_size_t(length), advice) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"madvise({start:#x}, {length}): {os.strerror(err)}")


def trim_heap() -> bool:
    """glibc ``malloc_trim(0)``: return the free pages of the malloc heaps to the OS.
    False where the C library has no malloc_trim (e.g. musl): then it is a no-op."""
    trim = _c_function("malloc_trim", (ctypes.c_size_t,))
    if trim is None:
        return False
    trim(0)
    return True


M_TRIM_THRESHOLD = -1  # malloc.h mallopt parameters
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_MAX = 32 * 2**20  # glibc's ceiling for M_MMAP_THRESHOLD (64-bit)


def retain_heap(nbytes: int) -> bool:
    """glibc ``mallopt``: allocations below min(nbytes, 32 MiB) come from the malloc heap
    instead of fresh mappings, and up to ``nbytes`` of free heap stays mapped instead of
    being returned to the OS. A step's activations (a few MiB each, freed when the step
    ends) then reuse the same pages, where by default they are mapped, page-faulted in
    (zeroed by the kernel) and unmapped again every step: 1.5-3k faults per 512-token
    prefill step of the demo model. Peak memory is unchanged; what a step freed is kept
    for the next one. Allocations of 32 MiB or more are always mapped (glibc's limit).
    False (nothing changed) where the C library has no mallopt or refuses the values."""
    mallopt = _c_function("mallopt", (ctypes.c_int, ctypes.c_int))
    if nbytes <= 0 or mallopt is None:
        return False
    mmap_ok = mallopt(M_MMAP_THRESHOLD, min(nbytes, MMAP_THRESHOLD_MAX))
    trim_ok = mallopt(M_TRIM_THRESHOLD, min(nbytes, 2**31 - 1))
    return bool(mmap_ok and trim_ok)


def page_span(addr: int, nbytes: int) -> tuple[int, int]:
    """(start, length) of the whole pages inside [addr, addr + nbytes); length may be 0.
    Partial pages at either end are left alone (a neighbour tensor may use them)."""
    start = -(-addr // PAGE) * PAGE
    end = (addr + nbytes) // PAGE * PAGE
    return start, max(0, end - start)


def release_pages(t: torch.Tensor) -> int:
    """Drop the resident pages of a tensor backed by a private file mapping (a checkpoint
    tensor). Returns the bytes of address range released (0 when ``t`` is not in such a
    mapping, e.g. an ordinary anonymous tensor, or spans less than one whole page)."""
    if t.device.type != "cpu" or not t.is_contiguous() or t.numel() == 0:
        return 0
    addr, nbytes = t.data_ptr(), t.numel() * t.element_size()
    m = mapping_of(addr)
    if m is None or not m.private_file or addr + nbytes > m.end:
        return 0
    start, length = page_span(addr, nbytes)
    if length:
        _madvise(start, length, MADV_DONTNEED)
    return length


@dataclass(frozen=True, slots=True)
class WeightSource:
    """An FP8 linear's weight as the (memory-mapped) shards it is made of.

    ``build()`` returns the canonical Fp8Weight: the single part itself, or ``combine``
    of the parts (e.g. the row concatenation of q/k/v, a fresh anonymous copy the caller
    drops once its kernel has packed it). ``release()`` drops the parts' resident mapped
    pages; a later ``build()`` reads them again from the file."""

    parts: tuple[Fp8Weight, ...]
    combine: Callable[[list[Fp8Weight]], Fp8Weight] | None = None

    def __post_init__(self) -> None:
        if not self.parts:
            raise ValueError("WeightSource needs at least one part")
        if self.combine is None and len(self.parts) != 1:
            raise ValueError("several parts need a combine function")

    @classmethod
    def of(cls, w: Fp8Weight | WeightSource) -> WeightSource:
        return w if isinstance(w, WeightSource) else cls((w,))

    def build(self) -> Fp8Weight:
        if self.combine is None:
            return self.parts[0]
        return self.combine(list(self.parts))

    def release(self) -> int:
        return sum(release_pages(p.weight) for p in self.parts)


def available_bytes(meminfo: str = "/proc/meminfo") -> int | None:
    """The kernel's estimate of memory a new allocation can get without swapping
    (MemAvailable); None where it cannot be read."""
    try:
        with open(meminfo) as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None
