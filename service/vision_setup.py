"""Startup of image input: load the vision tower or say why images are not served."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def load_vision_runtime(model_dir: Path, settings: Any, tokenizer: Any
                        ) -> tuple[Any, str | None]:
    """(VisionRuntime, None) when images are served, else (None, the reason)."""
    from engine.vision.config import read_vision_config

    if settings.limit_mm_per_prompt == 0:  # the vision config is not even read
        return None, "image input disabled (--limit-mm-per-prompt image=0)"
    cfg = read_vision_config(model_dir, settings.checkpoint_layout)
    if cfg is None:
        return None, "the checkpoint has no vision tower"
    from engine.vision.layout import ImageTokenIds

    ids = ImageTokenIds.from_tokenizer(tokenizer)
    if ids is None:
        return None, "the tokenizer lacks [IMG], [IMG_BREAK] or [IMG_END]"
    max_size = settings.max_image_size or cfg.image_size
    if max_size > cfg.image_size:
        log.warning("--max-image-size %d is over the model's image_size %d: using %d",
                    max_size, cfg.image_size, cfg.image_size)
        max_size = cfg.image_size
    from engine.vision.encoder import load_vision_encoder
    from engine.vision.runtime import VisionLimits, VisionRuntime

    encoder = load_vision_encoder(model_dir, layout=settings.checkpoint_layout)
    assert encoder is not None
    limits = VisionLimits(max_images=settings.limit_mm_per_prompt, max_image_size=max_size,
                          cache_bytes=settings.image_cache_mib * 2**20)
    return VisionRuntime(encoder, ids, limits,
                         encoder_threads=settings.vision_encoder_threads), None
