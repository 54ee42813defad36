"""The prompt tokens of one image and where its features go.

Layout (mistral-common's ImageEncoder): T_h rows, each T_w x [IMG] followed by
[IMG_BREAK], the last row's [IMG_BREAK] replaced by [IMG_END]. Only the [IMG] positions
take projector rows (in order); [IMG_BREAK] / [IMG_END] keep their text embeddings.
Every id is resolved by name from the tokenizer, never hard-coded."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from engine.vision.preprocess import ImageGrid

IMG, IMG_BREAK, IMG_END = "[IMG]", "[IMG_BREAK]", "[IMG_END]"


@dataclass(frozen=True, slots=True)
class ImageTokenIds:
    img: int
    img_break: int
    img_end: int

    def __post_init__(self) -> None:
        if len({self.img, self.img_break, self.img_end}) != 3:
            raise ValueError(f"image token ids must differ: {self}")

    @classmethod
    def from_tokenizer(cls, tokenizer: Any) -> ImageTokenIds | None:
        """None when the tokenizer lacks any of [IMG], [IMG_BREAK], [IMG_END]."""
        ids = [tokenizer.token_to_id(t) for t in (IMG, IMG_BREAK, IMG_END)]
        if any(i is None for i in ids):
            return None
        return cls(*ids)


def image_tokens(grid: ImageGrid, ids: ImageTokenIds) -> list[int]:
    """The grid.num_tokens prompt ids of one image."""
    row = [ids.img] * grid.cols
    out: list[int] = []
    for r in range(grid.rows):
        out += row
        out.append(ids.img_end if r == grid.rows - 1 else ids.img_break)
    return out


def image_offsets(grid: ImageGrid) -> list[int]:
    """Offsets of the [IMG] tokens within image_tokens(grid, ...): feature row j goes to
    offset image_offsets(grid)[j]."""
    return [r * (grid.cols + 1) + c for r in range(grid.rows) for c in range(grid.cols)]


def expand_images(ids: Sequence[int], grids: Sequence[ImageGrid], tok: ImageTokenIds
                  ) -> tuple[list[int], list[int]]:
    """Template output with one [IMG] per image part, in order -> (the prompt with each
    [IMG] expanded to its image's layout, the start position of each image). ValueError
    when the [IMG] count differs from the number of images (e.g. "[IMG]" typed as text)."""
    where = [i for i, t in enumerate(ids) if t == tok.img]
    if len(where) != len(grids):
        raise ValueError(f"the rendered prompt holds {len(where)} [IMG] tokens for "
                         f"{len(grids)} images")
    out: list[int] = []
    starts: list[int] = []
    prev = 0
    for pos, grid in zip(where, grids, strict=True):
        out += ids[prev:pos]
        starts.append(len(out))
        out += image_tokens(grid, tok)
        prev = pos + 1
    out += ids[prev:]
    return out, starts
