"""VisionRuntime: what the server holds to take images: the encoder, the image token ids,
the limits and the encoded-image cache.

Scheduling choice: images are encoded *ahead of scheduling*, before the request reaches
the engine: the request's worker thread (the routes' thread pool) decodes the bytes and
looks up the cache, then hands preprocessing + encoding to the one encoder thread
(engine/vision/encoder_thread.py), whose torch intra-op threads are capped by
``--vision-encoder-threads``; the engine thread only scatters finished features into
prefill chunks. Running streams keep stepping while an image encodes (they share the
cores, so their inter-token latency rises, but they never stop), and a slow image never
holds a step. One image encodes at a time (one encoder thread): concurrent encodes
would only share the same cores. Requests whose images are cached never wait for it."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from engine.vision.decode import DEFAULT_MAX_PIXELS, decode_image
from engine.vision.encoder import VisionEncoder
from engine.vision.encoder_thread import EncoderThread
from engine.vision.image_cache import ImageCache, image_key
from engine.vision.layout import ImageTokenIds
from engine.vision.preprocess import ImageGrid, prepare_image, token_grid

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class VisionLimits:
    max_images: int  # per prompt (--limit-mm-per-prompt image=N), >= 1
    max_image_size: int  # longest edge after resizing, <= the model's image_size
    cache_bytes: int = 512 * 2**20  # encoded-image cache (LRU)
    max_pixels: int = DEFAULT_MAX_PIXELS  # decoded image size limit

    def __post_init__(self) -> None:
        if self.max_images < 1:
            raise ValueError("max_images must be >= 1 (0 means no vision runtime at all)")
        if self.max_image_size < 1:
            raise ValueError("max_image_size must be >= 1")


@dataclass(frozen=True, slots=True, eq=False)
class EncodedImage:
    key: bytes  # content hash (engine/vision/image_cache.py)
    grid: ImageGrid
    features: torch.Tensor  # [grid.num_image_tokens, H] bf16
    cached: bool  # served from the image cache
    seconds: float  # preprocessing + encoding time (0 when cached)


class VisionObserver(Protocol):
    def on_image(self, seconds: float, num_tokens: int, cached: bool) -> None: ...


class VisionRuntime:
    def __init__(self, encoder: VisionEncoder, ids: ImageTokenIds, limits: VisionLimits,
                 observer: VisionObserver | None = None,
                 encoder_threads: int | None = None) -> None:
        """encoder_threads: torch intra-op threads of the encoder thread (None: the
        constructing thread's count, i.e. --threads)."""
        c = encoder.config
        if limits.max_image_size > c.image_size:
            raise ValueError(f"max_image_size {limits.max_image_size} exceeds the model's "
                             f"image_size {c.image_size}")
        if ids.img != c.image_token_id:
            log.warning("tokenizer [IMG] is id %d, the vision config says %d: using the "
                        "tokenizer's", ids.img, c.image_token_id)
        self.encoder = encoder
        self.ids = ids
        self.limits = limits
        self.cache = ImageCache(limits.cache_bytes)
        self.observer = observer
        self.worker = EncoderThread(encoder_threads)

    def encode(self, data: bytes) -> EncodedImage:
        """Image file bytes -> features (ImageDecodeError for bad bytes)."""
        image = decode_image(data, self.limits.max_pixels)
        step = self.encoder.config.token_pixels
        grid = token_grid(image.width, image.height, self.limits.max_image_size, step)
        key = image_key(data, grid)
        hit = self.cache.get(key)
        if hit is not None:
            out = EncodedImage(key, grid, hit, cached=True, seconds=0.0)
        else:
            features, seconds = self.worker.run(self._encode, image)
            out = EncodedImage(key, grid, features, cached=False, seconds=seconds)
            self.cache.put(key, features)
        if self.observer is not None:
            self.observer.on_image(out.seconds, grid.num_image_tokens, out.cached)
        return out

    def _encode(self, image: Any) -> tuple[torch.Tensor, float]:
        """On the encoder thread: PIL image -> (features [T, H] bf16, seconds)."""
        t0 = time.perf_counter()
        prepared = prepare_image(image, self.limits.max_image_size,
                                 self.encoder.config.token_pixels)
        return self.encoder(prepared.pixels), time.perf_counter() - t0

    def describe(self) -> dict[str, Any]:
        """For /kernels, /v1/models and the startup log."""
        c = self.encoder.config
        return {"images": True, "max_images_per_prompt": self.limits.max_images,
                "max_image_size": self.limits.max_image_size, "model_image_size": c.image_size,
                "vision_layers": c.num_layers, "vision_hidden_size": c.hidden_size,
                "vision_weights_mib": round(self.encoder.weights.nbytes / 2**20, 1),
                "gemm": self.encoder.gemm.mode, "gemm_choice": self.encoder.gemm.why,
                "attention": "torch sdpa", "encoder_threads": self.worker.effective,
                "image_cache_mib": round(self.limits.cache_bytes / 2**20, 1)}
