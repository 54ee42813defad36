"""Checks on one tensor at a time. Every failure is a CheckpointError naming the file and
the tensor as spelled on disk."""

from __future__ import annotations

import torch

from engine.checkpoint.errors import tensor_error
from engine.checkpoint.tensors import TensorMeta, TensorStore

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


def read_float(store: TensorStore, name: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A bf16/fp16/fp32 tensor of exactly ``shape`` as bf16 (no copy when stored bf16)."""
    meta = store.meta(name)
    check_meta(meta, name, FLOAT_DTYPES, (shape,))
    t = store.get(name)
    return t if t.dtype == torch.bfloat16 else t.to(torch.bfloat16)


def read_fp8(store: TensorStore, name: str, shape: tuple[int, int]) -> torch.Tensor:
    """An float8_e4m3fn [N, K] weight, memory-mapped, never converted."""
    check_meta(store.meta(name), name, (FP8,), (shape,))
    return store.get(name)


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
