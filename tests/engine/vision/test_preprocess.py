"""Preprocessing and the image-token layout against mistral-common's ImageEncoder (the
reference; it resizes with OpenCV, a test dependency: opencv-python-headless).

Pixel tolerance: max |ours - theirs| <= 1e-2 in normalized units (about 0.7 of one 8-bit
grey level: both run the same a = -0.75 bicubic kernel in fp32, summed in another order);
measured <= 7e-4 on noise images up to 3000 pixels a side, ~1e-4 on smooth ones, 5e-3 at the
edge of a 20000 x 10 image shrunk 13x. PIL's own bicubic resize (a = -0.5, antialiased)
is far outside it, which the last test checks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image

from engine.vision.layout import ImageTokenIds, image_offsets, image_tokens
from engine.vision.preprocess import ImageGrid, prepare_image, token_grid

PIXEL_TOL = 1e-2
IDS = ImageTokenIds(img=10, img_break=12, img_end=13)


def _encoder(max_size: int = 1540):  # type: ignore[no-untyped-def]
    from mistral_common.tokens.tokenizers.image import ImageConfig, ImageEncoder, SpecialImageIDs

    return ImageEncoder(ImageConfig(14, max_size, 2), SpecialImageIDs(10, 12, 13))


def _noise(w: int, h: int, mode: str = "RGB", seed: int = 0) -> Image.Image:
    rng = np.random.default_rng(seed)
    channels = {"RGB": 3, "RGBA": 4, "L": 1, "LA": 2}[mode]
    arr = rng.integers(0, 256, (h, w, channels), dtype=np.uint8)
    return Image.fromarray(arr[..., 0] if channels == 1 else arr, mode)


def _reference(img: Image.Image, max_size: int = 1540):  # type: ignore[no-untyped-def]
    import cv2  # noqa: F401  mistral-common's ImageEncoder resizes with OpenCV (a test extra)
    from mistral_common.protocol.instruct.chunk import ImageChunk

    return _encoder(max_size)(ImageChunk(image=img))


CASES = [  # (width, height, mode)
    (512, 512, "RGB"), (1024, 768, "RGB"), (33, 17, "RGB"), (1, 1, "RGB"), (3, 5, "RGB"),
    (57, 29, "RGBA"), (40, 61, "L"), (30, 30, "LA"),
    (2000, 1000, "RGB"), (1541, 30, "RGB"), (100, 3000, "RGB"), (20000, 10, "RGB"),
]


@pytest.mark.parametrize("w,h,mode", CASES)
def test_pixels_and_tokens_match_mistral_common(w: int, h: int, mode: str) -> None:
    img = _noise(w, h, mode)
    ref = _reference(img)
    ours = prepare_image(img, 1540)
    theirs = torch.from_numpy(ref.image)
    assert ours.pixels.dtype == torch.float32 and ours.pixels.shape == theirs.shape
    assert ours.pixels.shape[1:] == (28 * ours.grid.rows, 28 * ours.grid.cols)
    assert float((ours.pixels - theirs).abs().max()) <= PIXEL_TOL
    assert image_tokens(ours.grid, IDS) == ref.tokens


def test_rgba_transparency_is_white() -> None:
    img = Image.new("RGBA", (28, 28), (255, 0, 0, 0))  # fully transparent red
    px = prepare_image(img, 1540).pixels
    white = (1.0 - torch.tensor([0.48145466, 0.4578275, 0.40821073])) / torch.tensor(
        [0.26862954, 0.26130258, 0.27577711])
    assert torch.allclose(px[:, 0, 0], white, atol=1e-5)


@pytest.mark.parametrize("w,h,max_size,grid", [
    (1024, 768, 1540, (28, 37)),  # 1036 [IMG] + 28 row tokens = 1064
    (1540, 1540, 1540, (55, 55)),  # 3025 [IMG], 3080 prompt tokens
    (4000, 3000, 1540, (42, 55)),  # round(3000 / (4000/1540)) = 1155 -> 42 rows
    (1024, 768, 512, (14, 19)),  # --max-image-size 512
    (1, 1, 1540, (1, 1)),
    (20000, 10, 1540, (1, 55)),  # the short side never rounds to 0
])
def test_token_grid(w: int, h: int, max_size: int, grid: tuple[int, int]) -> None:
    g = token_grid(w, h, max_size, 28)
    assert (g.rows, g.cols) == grid
    if (w, h) == (1540, 1540):
        assert g.num_tokens == 3080 and g.num_image_tokens == 3025
    if max_size == 1540 and max(w, h) <= 20000:
        assert (g.cols, g.rows) == _encoder()._image_to_num_tokens(Image.new("RGB", (w, h)))


def test_layout_and_offsets() -> None:
    grid = ImageGrid(rows=2, cols=3)
    toks = image_tokens(grid, IDS)
    assert toks == [10, 10, 10, 12, 10, 10, 10, 13]
    assert image_offsets(grid) == [0, 1, 2, 4, 5, 6]
    assert all(toks[o] == 10 for o in image_offsets(grid))
    assert len(toks) == grid.num_tokens and len(image_offsets(grid)) == grid.num_image_tokens


def test_ids_resolved_by_name_from_the_tokenizer(tmp_path) -> None:
    from engine.synth import SynthSpec, write_checkpoint
    from engine.text.tokenizer import Tokenizer

    write_checkpoint(tmp_path, SynthSpec.preset("tiny", tokenizer="tekken"))
    assert ImageTokenIds.from_tokenizer(Tokenizer.from_dir(tmp_path)) == IDS

    class NoImages:
        def token_to_id(self, token: str) -> int | None:
            return None

    assert ImageTokenIds.from_tokenizer(NoImages()) is None


def test_pil_bicubic_would_fail_the_tolerance() -> None:
    """The tolerance is meaningful: PIL's resampling is another filter."""
    img = _noise(1024, 768)
    ref = torch.from_numpy(_reference(img).image)
    g = prepare_image(img, 1540).grid
    pil = img.resize((28 * g.cols, 28 * g.rows), Image.BICUBIC)
    arr = torch.from_numpy(np.asarray(pil, dtype=np.float32)).permute(2, 0, 1)
    mean = torch.tensor([0.48145466, 0.4578275, 0.40821073])[:, None, None]
    std = torch.tensor([0.26862954, 0.26130258, 0.27577711])[:, None, None]
    assert float(((arr / 255 - mean) / std - ref).abs().max()) > 20 * PIXEL_TOL
