"""Checks on one tensor at a time. Every failure is a CheckpointError naming the file and
the tensor as spelled on disk."""

from __future__ import annotations

import torch

from engine.checkpoint.errors import tensor_error
from engine.checkpoint.tensors import TensorMeta, TensorStore
from engine.memory import release_pages

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
FP8 = torch.float8_e4m3fn


def _dt(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def check_meta(meta: TensorMeta, name: str, dtypes: tuple[torch.dtype, ...],
               shapes: tuple[tuple[int, ...], ...]) -> None:
    """dtype in ``dtypes`` and shape one of ``shapes``."""
    if meta.dtype not in dtypes:
        want = " or ".join(_dt(d) for d in dtypes)
        raise tensor_error(meta.file, name, f"wrong dtype {_dt(meta.dtype)}, expected {want}")
    if meta.shape not in shapes:
        want = " or ".join(str(list(s)) for s in shapes)
        raise tensor_error(meta.file, name, f"wrong shape {list(meta.shape)}, expected {want}")


CHUNK = 1 << 24  # elements per pass of a value check (bounded temporaries)


def _first_bad(flat: torch.Tensor, bad) -> int | None:  # type: ignore[no-untyped-def]
    """The first index of 1-D ``flat`` where ``bad(chunk)`` (a bool tensor) holds."""
    for start in range(0, flat.numel(), CHUNK):
        hit = bad(flat[start:start + CHUNK]).nonzero()
        if hit.numel():
            return start + int(hit[0, 0])
    return None


def read_float(store: TensorStore, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A bf16/fp16/fp32 tensor of exactly ``shape`` as bf16 (no copy when stored bf16),
    every value finite (a NaN norm weight turns every answer into nothing)."""
    meta = store.meta(name)
    check_meta(meta, name, FLOAT_DTYPES, (shape,))
    t = store.get(name)
    t = t if t.dtype == torch.bfloat16 else t.to(torch.bfloat16)
    flat = t.reshape(-1)
    # two reductions, no temporaries (max propagates NaN); the index only when one is bad
    ok = flat.numel() == 0 or bool(torch.isfinite(flat.max()) and torch.isfinite(flat.min()))
    at = None if ok else _first_bad(flat, lambda c: ~torch.isfinite(c))
    if at is not None:
        raise tensor_error(meta.file, name, f"value {t.reshape(-1)[at].item()} at flat index "
                           f"{at}: not finite")
    release_pages(t)  # the check read every page: hand them back (an embedding is faulted
    return t          # in row by row as tokens need it)


def read_fp8(store: TensorStore, name: str, shape: tuple[int, int]) -> torch.Tensor:
    """An float8_e4m3fn [N, K] weight, memory-mapped, never converted; no NaN code
    (0x7f / 0xff: e4m3fn has no inf, so every other code is a finite value)."""
    meta = store.meta(name)
    check_meta(meta, name, (FP8,), (shape,))
    t = store.get(name)
    u = t.reshape(-1).view(torch.uint8)
    # the NaN codes are uint8's largest (0xff) and, read as int8, int8's largest (0x7f):
    # two reductions, no temporaries; the index only when one is there
    nan = u.numel() > 0 and (int(u.max()) == 0xFF or int(u.view(torch.int8).max()) == 0x7F)
    at = _first_bad(u, lambda c: (c | 0x80) == 0xFF) if nan else None
    if at is not None:
        raise tensor_error(meta.file, name, f"NaN code at flat index {at} "
                           f"(row {at // shape[1]}, column {at % shape[1]})")
    release_pages(t)  # read again from the page cache when packed
    return t


def read_scale(store: TensorStore, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A positive, finite scale as fp32 of ``shape``; shape [] also accepts [1] on disk."""
    meta = store.meta(name)
    shapes = ((), (1,)) if shape == () else (shape,)
    check_meta(meta, name, FLOAT_DTYPES, shapes)
    s = store.get(name).to(torch.float32).reshape(shape).clone()
    if torch.isnan(s).any():
        raise tensor_error(meta.file, name, "scale is NaN")
    if torch.isinf(s).any():
        raise tensor_error(meta.file, name, "scale is inf")
    if (s <= 0).any():
        raise tensor_error(meta.file, name, f"scale is <= 0 (min {s.min().item():g})")
    return s
