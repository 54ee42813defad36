"""One decoded image -> the tower's input, as mistral-common's ImageEncoder does it
(tokens/tokenizers/image.py), without OpenCV:

1. size: ratio = max(w, h) / max_size; if > 1 each side becomes max(round(side / ratio), 1);
   tokens per side = (side - 1) // (patch * merge) + 1 (T_w, T_h); the image is resized to
   exactly 28*T_w x 28*T_h (patch 14, merge 2), up or down.
2. colour: RGB; any other mode (RGBA, LA, P, L, CMYK, I;16, ...) goes through RGBA and is
   composited onto white, then RGB.
3. resampling: bicubic with a = -0.75, pixel centres aligned, edges clamped, no
   antialiasing: torch's ``interpolate(mode="bicubic", align_corners=False)``, the
   kernel OpenCV's INTER_CUBIC uses (tests/engine/vision/test_preprocess.py states the
   tolerance against mistral-common run with OpenCV).
4. values: /255, minus the CLIP mean, over the CLIP std, channel-major.

Output: pixels [3, 28*T_h, 28*T_w] fp32 and the token grid (T_h, T_w)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

CLIP_MEAN = (0.48145466, 0.4578275, 0.40821073)
CLIP_STD = (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True, slots=True)
class ImageGrid:
    """An image's token grid: T_h rows of T_w [IMG] tokens."""

    rows: int  # T_h
    cols: int  # T_w

    def __post_init__(self) -> None:
        if self.rows < 1 or self.cols < 1:
            raise ValueError(f"image grid {self.rows}x{self.cols} must be at least 1x1")

    @property
    def num_image_tokens(self) -> int:
        """[IMG] tokens = rows of the projector output."""
        return self.rows * self.cols

    @property
    def num_tokens(self) -> int:
        """Prompt tokens of the image: each row's [IMG]s plus its [IMG_BREAK] / [IMG_END]."""
        return self.rows * (self.cols + 1)


@dataclass(frozen=True, slots=True)
class PreparedImage:
    pixels: torch.Tensor  # [3, token_pixels * rows, token_pixels * cols] fp32, normalized
    grid: ImageGrid


def token_grid(width: int, height: int, max_size: int, token_pixels: int) -> ImageGrid:
    """The grid of a width x height image whose longest edge may be at most max_size."""
    if width < 1 or height < 1:
        raise ValueError(f"image size {width}x{height} is empty")
    ratio = max(width / max_size, height / max_size)
    w, h = float(width), float(height)
    if ratio > 1:
        w, h = max(round(w / ratio), 1), max(round(h / ratio), 1)
    return ImageGrid(rows=int((h - 1) // token_pixels) + 1, cols=int((w - 1) // token_pixels) + 1)


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB, with transparency composited onto white (mistral-common's _convert_to_rgb)."""
    if image.mode == "RGB":
        return image
    rgba = image if image.mode == "RGBA" else image.convert("RGBA")
    white = Image.new("RGBA", rgba.size, "WHITE")
    white.paste(rgba, (0, 0), rgba)
    return white.convert("RGB")


def resize_bicubic(rgb: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """rgb [3, H, W] fp32 (0..255) -> [3, height, width] fp32, not clamped."""
    out = F.interpolate(rgb[None], size=(height, width), mode="bicubic", align_corners=False)
    return out[0]


def normalize(rgb: torch.Tensor) -> torch.Tensor:
    """[3, H, W] fp32 0..255 -> (x / 255 - mean) / std per channel."""
    mean = torch.tensor(CLIP_MEAN, dtype=torch.float32)[:, None, None]
    std = torch.tensor(CLIP_STD, dtype=torch.float32)[:, None, None]
    return (rgb / 255.0 - mean) / std


def prepare_image(image: Image.Image, max_size: int, token_pixels: int = 28) -> PreparedImage:
    """A decoded image -> normalized pixels at its token grid's size."""
    grid = token_grid(image.width, image.height, max_size, token_pixels)
    arr = np.asarray(to_rgb(image), dtype=np.float32)  # [H, W, 3]
    rgb = torch.from_numpy(arr).permute(2, 0, 1).contiguous()
    pixels = resize_bicubic(rgb, grid.rows * token_pixels, grid.cols * token_pixels)
    return PreparedImage(pixels=normalize(pixels).contiguous(), grid=grid)
