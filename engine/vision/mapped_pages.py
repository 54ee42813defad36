"""Dropping the resident pages of a memory-mapped tensor that was copied and is no longer
read (the vision tower's q/k/v and gate/up, concatenated at load: engine/vision/weights.py).

A checkpoint file stays mapped while any of its tensors lives (the text decoder's share
the file with the vision tower's), so the pages touched while copying would stay in the
process's RSS beside the copy. ``madvise(MADV_DONTNEED)`` unmaps them from this process
(the file's page cache keeps them, reclaimable); a later read would fault them back in
from the file, unchanged. Only whole pages inside the tensor are released, so a
neighbouring tensor sharing an edge page keeps it. Linux only: elsewhere a no-op."""

from __future__ import annotations

import ctypes
import mmap
import sys

import torch

MADV_DONTNEED = 4


def _madvise():  # type: ignore[no-untyped-def]
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    fn.restype = ctypes.c_int
    return fn


_MADVISE = _madvise()


def release_mapped_pages(t: torch.Tensor) -> int:
    """Drop the resident whole pages of ``t`` (a contiguous view of a read-only file
    mapping, never written); bytes released (0 where unsupported or refused). Never call
    it on anonymous memory that is still in use: its pages would read back as zeros."""
    if _MADVISE is None or not t.is_contiguous():
        return 0
    page = mmap.PAGESIZE
    start = t.data_ptr()
    end = start + t.numel() * t.element_size()
    lo, hi = -(-start // page) * page, end // page * page
    if hi <= lo or _MADVISE(lo, hi - lo, MADV_DONTNEED) != 0:
        return 0
    return hi - lo
