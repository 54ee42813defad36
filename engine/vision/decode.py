"""Image bytes -> a decoded PIL image, with the failures a client can cause named.

Formats: whatever Pillow decodes (PNG, JPEG, WebP, GIF (first frame), BMP, TIFF, ...).
Decompression bombs are refused before decoding: at most ``max_pixels`` pixels."""

from __future__ import annotations

import io
import warnings

from PIL import Image

DEFAULT_MAX_PIXELS = 64 * 2**20  # 64 Mpx: ~8K x 8K


class ImageDecodeError(ValueError):
    """The bytes are not an image this server can decode; the message says why."""


def decode_image(data: bytes, max_pixels: int = DEFAULT_MAX_PIXELS) -> Image.Image:
    """Decode ``data`` fully (lazy decoders would fail later, outside the 400 path)."""
    if not data:
        raise ImageDecodeError("image data is empty")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            img = Image.open(io.BytesIO(data))
            if img.width * img.height > max_pixels:
                raise ImageDecodeError(f"image of {img.width}x{img.height} pixels is over "
                                       f"the limit of {max_pixels} pixels")
            img.load()
    except ImageDecodeError:
        raise
    except (Image.DecompressionBombWarning, Image.DecompressionBombError) as exc:
        raise ImageDecodeError(f"image too large to decode: {exc}") from None
    except Exception as exc:  # Pillow raises many unrelated types for bad data
        raise ImageDecodeError(f"cannot decode image: {type(exc).__name__}: {exc}") from None
    if img.width < 1 or img.height < 1:
        raise ImageDecodeError(f"image size {img.width}x{img.height} is empty")
    return img
