"""Tensor access for safetensors checkpoints (single file or shards + index).

Names, dtypes and shapes come from the file headers without reading data. Tensors are
served by safetensors' ``safe_open(..., framework="pt")``, whose CPU tensors are backed by
a memory map of the file: nothing is copied, and pages are read when first touched."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import safe_open

from engine.checkpoint.detect import read_json
from engine.checkpoint.errors import CheckpointError, tensor_error

DTYPES: dict[str, torch.dtype] = {
    "F8_E4M3": torch.float8_e4m3fn,
    "F8_E5M2": torch.float8_e5m2,
    "BF16": torch.bfloat16,
    "F16": torch.float16,
    "F32": torch.float32,
    "F64": torch.float64,
    "I8": torch.int8,
    "U8": torch.uint8,
    "I16": torch.int16,
    "I32": torch.int32,
    "I64": torch.int64,
    "BOOL": torch.bool,
}


@dataclass(frozen=True, slots=True)
class TensorMeta:
    file: str  # file name relative to the checkpoint directory
    dtype: torch.dtype
    shape: tuple[int, ...]


def _truncation_culprit(path: Path) -> str | None:
    """The first tensor whose bytes lie past the end of a cut-short file, if any."""
    try:
        size = path.stat().st_size
        with path.open("rb") as fh:
            (n,) = struct.unpack("<Q", fh.read(8))
            if n > size - 8:  # no header of that length: not a cut-short safetensors file
                return None
            header = json.loads(fh.read(n))
    except (OSError, ValueError, struct.error):
        return None
    data_size = size - 8 - n
    spans = [(v["data_offsets"][1], k) for k, v in header.items() if k != "__metadata__"]
    beyond = sorted(s for s in spans if s[0] > data_size)
    return beyond[0][1] if beyond else None


def _open(model_dir: Path, file: str):  # type: ignore[no-untyped-def]
    path = model_dir / file
    if not path.exists():
        raise CheckpointError(f"{file}: missing from {model_dir}")
    if not path.is_file():
        raise CheckpointError(f"{file}: not a file (a safetensors file was expected)")
    try:
        return safe_open(str(path), framework="pt")
    except Exception as exc:  # safetensors raises its own SafetensorError / OSError
        culprit = _truncation_culprit(path)
        reason = " ".join(str(exc).split())
        with path.open("rb") as fh:
            start = fh.read(64)
        if start.startswith(b"version https://git-lfs"):
            raise CheckpointError(f"{file}: a Git LFS pointer, not the weights (fetch them: "
                                  "git lfs pull)") from None
        if culprit is not None:
            problem = f"data extends past end of file; truncated? ({reason})"
            raise tensor_error(file, culprit, problem) from None
        raise CheckpointError(
            f"{file}: unreadable safetensors file; truncated or corrupt ({reason})") from None


class TensorStore:
    """name -> TensorMeta for every tensor of a checkpoint, plus mmap-backed reads.
    Holds open file handles; call :meth:`close` (or use ``with``) when done. Tensors
    returned by :meth:`get` stay valid after closing."""

    def __init__(self, model_dir: Path, files: list[str], index_file: str | None = None,
                 index_map: dict[str, str] | None = None) -> None:
        self.model_dir = Path(model_dir)
        self._source = index_file or ", ".join(files)  # what a missing tensor is missing from
        self._handles = {}
        self._meta: dict[str, TensorMeta] = {}
        for file in files:
            handle = _open(self.model_dir, file)
            self._handles[file] = handle
            for name in handle.keys():
                self._meta[name] = self._read_meta(handle, file, name)
        for name, file in (index_map or {}).items():
            if name not in self._meta or self._meta[name].file != file:
                raise CheckpointError(
                    f"{index_file}: tensor '{name}' is listed in shard '{file}' but not found there"
                )

    @staticmethod
    def _read_meta(handle, file: str, name: str) -> TensorMeta:  # type: ignore[no-untyped-def]
        sl = handle.get_slice(name)
        code = sl.get_dtype()
        if code not in DTYPES:
            raise tensor_error(file, name, f"unsupported dtype {code}")
        return TensorMeta(file=file, dtype=DTYPES[code], shape=tuple(sl.get_shape()))

    @classmethod
    def open_files(cls, model_dir: Path, single: str, index: str) -> TensorStore:
        """A single ``single`` file, or the shards listed in ``index`` (weight_map)."""
        model_dir = Path(model_dir)
        if not (model_dir / index).exists():
            return cls(model_dir, [single])
        weight_map = read_json(model_dir / index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise CheckpointError(f"{index}: no weight_map")
        for name, shard in weight_map.items():
            if not isinstance(shard, str) or not shard or "/" in shard or shard in (".",
                                                                                  ".."):
                raise CheckpointError(f"{index}: tensor '{name}' points at {shard!r}, "
                                      "which is not a shard's file name")
        shards = sorted(set(weight_map.values()))
        for name, shard in sorted(weight_map.items()):
            if not (model_dir / shard).is_file():
                raise CheckpointError(
                    f"{index}: tensor '{name}' points at shard '{shard}', which is missing"
                    + ("" if not (model_dir / shard).exists() else " (not a file)"))
        return cls(model_dir, shards, index_file=index, index_map=weight_map)

    def names(self) -> list[str]:
        return list(self._meta)

    def __contains__(self, name: str) -> bool:
        return name in self._meta

    def meta(self, name: str) -> TensorMeta:
        """CheckpointError naming the files when the checkpoint has no such tensor."""
        got = self._meta.get(name)
        if got is None:
            raise CheckpointError(f"{self._source}: tensor '{name}' missing")
        return got

    def get(self, name: str) -> torch.Tensor:
        """The tensor as stored (dtype and shape of :meth:`meta`), memory-mapped."""
        file = self.meta(name).file
        try:
            return self._handles[file].get_tensor(name)
        except Exception as exc:
            raise tensor_error(file, name, f"cannot read ({' '.join(str(exc).split())})") from None

    def total_bytes(self, names: list[str]) -> int:
        return sum(
            self._meta[n].dtype.itemsize * _numel(self._meta[n].shape) for n in names
        )

    def close(self) -> None:
        self._handles.clear()

    def __enter__(self) -> TensorStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n
