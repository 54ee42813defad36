"""VisionEncoder: preprocessed pixels of one image -> its text-model embeddings, i.e. the
Pixtral tower then the projector; and loading it from a checkpoint directory.

    pixels [3, 28*T_h, 28*T_w] fp32 (engine/vision/preprocess.py) -> [T_h * T_w, H] bf16,
    rows in the order of the image's [IMG] tokens (row-major over the token grid)."""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from engine.checkpoint.detect import Layout, detect_layout
from engine.vision.config import VisionConfig, read_vision_config
from engine.vision.gemm import VisionGemm, choose_gemm
from engine.vision.projector import Projector
from engine.vision.tower import VisionTower
from engine.vision.weights import VisionWeights, load_vision_weights

log = logging.getLogger(__name__)


class VisionEncoder:
    def __init__(self, weights: VisionWeights, gemm: VisionGemm | None = None) -> None:
        """gemm None: measure this host (engine/vision/gemm.py)."""
        self.config: VisionConfig = weights.config
        self.weights = weights
        self.gemm = gemm if gemm is not None else choose_gemm()
        self.tower = VisionTower(weights, self.gemm)
        self.projector = Projector(weights, self.gemm)

    def __call__(self, pixels: torch.Tensor) -> torch.Tensor:
        """pixels [3, H, W] fp32, H and W multiples of patch x merge -> [T, H_text] bf16."""
        if pixels.dim() != 3 or pixels.shape[0] != 3 or pixels.dtype != torch.float32:
            raise ValueError(f"pixels must be fp32 [3, H, W], got {pixels.dtype} "
                             f"{list(pixels.shape)}")
        step = self.config.token_pixels
        if pixels.shape[1] % step or pixels.shape[2] % step:
            raise ValueError(f"image {pixels.shape[1]}x{pixels.shape[2]} is not a multiple "
                             f"of {step} pixels (patch x merge)")
        features, gh, gw = self.tower(pixels)
        return self.projector(features, gh, gw)

    def flops(self, height: int, width: int) -> float:
        """FLOPs of one image of height x width pixels (tower + projector GEMMs)."""
        c, p = self.config, self.config.patch_size
        t = (height // c.token_pixels) * (width // c.token_pixels)
        d, h, m = c.hidden_size, c.text_hidden_size, c.spatial_merge_size
        proj = 2 * t * (d * d * m * m + d * h + h * h)
        return self.tower.flops(height // p, width // p) + proj


def load_vision_encoder(model_dir: Path, gemm: VisionGemm | None = None,
                        layout: str | None = None) -> VisionEncoder | None:
    """The checkpoint's vision encoder (bf16; memory-mapped but for the fused q|k|v and
    gate|up copies, engine/vision/weights.py); None for text-only files. ``layout``: as
    engine/loader.py's."""
    from engine.loader import open_store

    cfg = read_vision_config(Path(model_dir), layout)
    if cfg is None:
        return None
    native = detect_layout(Path(model_dir), layout) is Layout.NATIVE
    store, _, _ = open_store(Path(model_dir), layout)
    with store:
        weights = load_vision_weights(store, cfg, native)
    enc = VisionEncoder(weights, gemm)
    log.info("vision encoder: %d layers, hidden %d, %.1f MiB bf16 (%s layout); GEMMs %s "
             "(%s)", cfg.num_layers, cfg.hidden_size, weights.nbytes / 2**20,
             "native" if native else "hf", enc.gemm.mode, enc.gemm.why)
    return enc
