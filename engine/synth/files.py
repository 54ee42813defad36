"""File writers for synthesized checkpoints: a streaming safetensors writer (the header is
written first from names/dtypes/shapes, then each tensor's bytes as they are generated, so
a model never has to be held in memory) and the JSON side files."""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

DTYPE_CODES = {torch.float8_e4m3fn: "F8_E4M3", torch.bfloat16: "BF16",
               torch.float16: "F16", torch.float32: "F32"}


@dataclass(frozen=True, slots=True)
class TensorEntry:
    name: str  # name on disk
    dtype: torch.dtype
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        n = self.dtype.itemsize
        for d in self.shape:
            n *= d
        return n


class SafetensorsStreamWriter:
    """Write one .safetensors file tensor by tensor, in the order of ``entries``."""

    def __init__(self, path: Path, entries: list[TensorEntry]) -> None:
        header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
        offset = 0
        for e in entries:
            header[e.name] = {"dtype": DTYPE_CODES[e.dtype], "shape": list(e.shape),
                              "data_offsets": [offset, offset + e.nbytes]}
            offset += e.nbytes
        raw = json.dumps(header, separators=(",", ":")).encode()
        raw += b" " * (-len(raw) % 8)
        self._pending = list(entries)
        self._fh = Path(path).open("wb")
        self._fh.write(struct.pack("<Q", len(raw)) + raw)

    def write(self, name: str, t: torch.Tensor) -> None:
        """``t`` must match the next entry exactly (name, dtype, shape)."""
        e = self._pending.pop(0)
        if (e.name, e.dtype, e.shape) != (name, t.dtype, tuple(t.shape)):
            raise ValueError(f"writing {name} {t.dtype} {tuple(t.shape)}, expected {e}")
        self._fh.write(t.contiguous().reshape(-1).view(torch.uint8).numpy().data)

    def close(self) -> None:
        if self._pending:
            raise ValueError(f"{len(self._pending)} tensors not written, first {self._pending[0]}")
        self._fh.close()


def write_json(path: Path, data: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(data, indent=2) + "\n")


def generation_config() -> dict[str, Any]:
    return {"bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 11}


def shard_entries(entries: list[TensorEntry], shard_bytes: int | None) -> list[list[TensorEntry]]:
    """Split in order into groups of at most shard_bytes (a single larger tensor gets its
    own shard); one group when shard_bytes is None."""
    if shard_bytes is None:
        return [list(entries)]
    shards: list[list[TensorEntry]] = [[]]
    size = 0
    for e in entries:
        if shards[-1] and size + e.nbytes > shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(e)
        size += e.nbytes
    return shards
