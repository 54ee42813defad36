"""Shared builders for the vision tests: tiny multimodal checkpoints (HF and native, one
seed = one model), transformers' Mistral3ForConditionalGeneration on them in fp32, and
random normalized pixels. No tests live here."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.synth import SynthSpec, write_checkpoint
from engine.synth.vision import VisionShape

# 8 x 8 patches at most (4 x 4 image tokens), 2 layers, head_dim 16
SMALL_VISION = VisionShape(hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                           head_dim=16, patch_size=14, image_size=112)


def vision_spec(layout: str = "hf-multimodal", **kw: object) -> SynthSpec:
    base: dict[str, object] = dict(layout=layout, vision=SMALL_VISION, seed=5,
                                   original_max_position_embeddings=8, tokenizer="tekken")
    if layout == "native":
        base["native_vision"] = True
    base.update(kw)
    return SynthSpec.preset("tiny", **base)


def write_pair(root: Path, **kw: object) -> tuple[Path, Path]:
    """(HF dir, native dir) holding the same tiny multimodal model."""
    write_checkpoint(root / "hf", vision_spec("hf-multimodal", **kw))
    write_checkpoint(root / "native", vision_spec("native", **kw))
    return root / "hf", root / "native"


def hf_model(path: Path):  # type: ignore[no-untyped-def]
    import transformers

    model = transformers.Mistral3ForConditionalGeneration.from_pretrained(
        path, dtype=torch.float32)
    return model.eval()


def pixels(h: int, w: int, seed: int) -> torch.Tensor:
    """[3, h, w] fp32, like normalized CLIP pixels (values ~ +-2)."""
    return torch.randn(3, h, w, generator=torch.Generator().manual_seed(seed)).clamp_(-2, 2)


def hf_image_features(model, images: list[torch.Tensor]) -> list[torch.Tensor]:  # type: ignore[no-untyped-def]
    """Projector output per image from transformers (images padded into one batch)."""
    hmax = max(i.shape[1] for i in images)
    wmax = max(i.shape[2] for i in images)
    batch = torch.zeros(len(images), 3, hmax, wmax)
    for b, img in enumerate(images):
        batch[b, :, : img.shape[1], : img.shape[2]] = img
    sizes = torch.tensor([[i.shape[1], i.shape[2]] for i in images])
    with torch.no_grad():
        out = model.model.get_image_features(pixel_values=batch, image_sizes=sizes)
    return [t.float() for t in out.pooler_output]


def rel_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """max |ours - ref| / max |ref|."""
    return float((ours.float() - ref).abs().max() / ref.abs().max())
