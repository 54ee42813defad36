"""PromptImage: one encoded image placed in a request's prompt, and what of it each
prefill chunk and each KV block sees.

An image occupies prompt positions [start, start + grid.num_tokens) laid out as in
engine/vision/layout.py; its feature row j goes to position start + image_offsets(grid)[j].
``key`` is the image's content hash: it names the features in the encoder cache and
goes into the prefix-cache key of every KV block that holds one of the image's positions
(engine/kv/block_hash.py), so two different images with the same token layout never
share KV blocks."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from engine.batch import ChunkEmbeds
from engine.vision.layout import image_offsets
from engine.vision.preprocess import ImageGrid


@dataclass(frozen=True, slots=True, eq=False)
class PromptImage:
    start: int  # prompt position of the image's first token
    grid: ImageGrid
    key: bytes  # content hash (engine/vision/image_cache.py)
    features: torch.Tensor  # [grid.num_image_tokens, H] bf16

    def __post_init__(self) -> None:
        f = self.features
        if f.dim() != 2 or f.dtype != torch.bfloat16 or f.shape[0] != self.grid.num_image_tokens:
            raise ValueError(f"image features must be bf16 [{self.grid.num_image_tokens}, H], "
                             f"got {f.dtype} {list(f.shape)}")
        if self.start < 0:
            raise ValueError(f"image start {self.start} < 0")

    @property
    def end(self) -> int:
        """One past the image's last prompt position."""
        return self.start + self.grid.num_tokens

    def positions(self) -> torch.Tensor:
        """[num_image_tokens] int64: the prompt position of each feature row."""
        return self.start + torch.tensor(image_offsets(self.grid), dtype=torch.int64)


def chunk_embeds(images: Sequence[PromptImage], start: int, end: int) -> ChunkEmbeds | None:
    """The embeds of a chunk running prompt positions [start, end); None if it holds no
    [IMG] position."""
    offsets: list[torch.Tensor] = []
    values: list[torch.Tensor] = []
    for img in images:
        if img.end <= start or img.start >= end:
            continue
        pos = img.positions()
        keep = (pos >= start) & (pos < end)
        offsets.append(pos[keep] - start)
        values.append(img.features[keep])
    if not offsets or not sum(len(o) for o in offsets):
        return None
    return ChunkEmbeds(tuple(torch.cat(offsets).tolist()), torch.cat(values).contiguous())


def block_image_keys(images: Sequence[PromptImage], start: int, end: int) -> tuple[bytes, ...]:
    """Content hashes of the images with a position in [start, end), in prompt order."""
    return tuple(img.key for img in images if img.start < end and img.end > start)


def check_layout(images: Sequence[PromptImage], prompt_ids: Sequence[int],
                 image_token_id: int | None) -> None:
    """Images in order, not overlapping, inside the prompt, and (unless image_token_id is
    None) [IMG] exactly where their features go. Raises ValueError."""
    prev = 0
    for img in images:
        if img.start < prev or img.end > len(prompt_ids):
            raise ValueError(f"image at positions [{img.start}, {img.end}) overlaps another "
                             f"or leaves the prompt of {len(prompt_ids)} tokens")
        prev = img.end
        if image_token_id is None:
            continue
        if any(prompt_ids[p] != image_token_id for p in img.positions().tolist()):
            raise ValueError(f"image at position {img.start}: its feature positions do not "
                             "all hold the [IMG] token")
