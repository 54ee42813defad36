"""The encoded-image cache: content hash -> projector output, LRU, bounded in bytes.

The key names everything the features depend on: the image bytes and the token grid
they are resized to (which folds in --max-image-size). A multi-turn chat that resends
the same image encodes it once. Thread-safe (encodes run on request threads)."""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict

import torch

from engine.vision.preprocess import ImageGrid


def image_key(data: bytes, grid: ImageGrid) -> bytes:
    """blake2b-256 of the bytes and the grid (32 bytes)."""
    h = hashlib.blake2b(digest_size=32, person=b"fp8serve.image")
    h.update(grid.rows.to_bytes(4, "little") + grid.cols.to_bytes(4, "little"))
    h.update(data)
    return h.digest()


class ImageCache:
    def __init__(self, max_bytes: int) -> None:
        if max_bytes < 0:
            raise ValueError("image cache max_bytes must be >= 0")
        self.max_bytes = max_bytes
        self._items: OrderedDict[bytes, torch.Tensor] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._items)

    def get(self, key: bytes) -> torch.Tensor | None:
        with self._lock:
            t = self._items.get(key)
            if t is not None:
                self._items.move_to_end(key)
            return t

    def put(self, key: bytes, features: torch.Tensor) -> None:
        """Keep ``features`` ([T, H] bf16); evict least recently used entries to fit.
        An entry larger than the whole cache is not kept."""
        size = features.numel() * features.element_size()
        with self._lock:
            if key in self._items or size > self.max_bytes:
                return
            while self._bytes + size > self.max_bytes:
                _, old = self._items.popitem(last=False)
                self._bytes -= old.numel() * old.element_size()
            self._items[key] = features
            self._bytes += size
