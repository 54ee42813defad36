"""The Pixtral vision tower + multimodal projector of a synthesized Mistral3 checkpoint:
its config.json block and its tensors (bf16, never read by fp8serve, present so the
checkpoint has the published layout and loads in transformers)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.synth.files import TensorEntry
from engine.synth.tensors import SynthTensor


@dataclass(frozen=True, slots=True)
class VisionShape:
    hidden_size: int = 32
    intermediate_size: int = 64
    num_layers: int = 1
    num_heads: int = 2
    head_dim: int = 16
    patch_size: int = 14
    image_size: int = 56


TINY_VISION = VisionShape()
PIXTRAL_VISION = VisionShape(hidden_size=1024, intermediate_size=4096, num_layers=24,
                             num_heads=16, head_dim=64, patch_size=14, image_size=1540)


def vision_config(v: VisionShape) -> dict[str, Any]:
    return {
        "model_type": "pixtral", "hidden_size": v.hidden_size,
        "intermediate_size": v.intermediate_size, "num_hidden_layers": v.num_layers,
        "num_attention_heads": v.num_heads, "head_dim": v.head_dim,
        "patch_size": v.patch_size, "image_size": v.image_size, "num_channels": 3,
        "hidden_act": "silu", "rope_theta": 10000.0, "attention_dropout": 0.0,
        "initializer_range": 0.02,
    }


def vision_plan(v: VisionShape, text_hidden: int, prefix: str, merge: int = 2) -> list[SynthTensor]:
    """prefix: "" (on-disk ``vision_tower.*``) or "model." (``model.vision_tower.*``)."""
    h, i = v.hidden_size, v.intermediate_size
    tower, proj = f"{prefix}vision_tower.", f"{prefix}multi_modal_projector."
    items: list[tuple[str, tuple[int, ...], str]] = [
        (f"{tower}patch_conv.weight", (h, 3, v.patch_size, v.patch_size), "vision"),
        (f"{tower}ln_pre.weight", (h,), "vision_norm"),
    ]
    for layer in range(v.num_layers):
        p = f"{tower}transformer.layers.{layer}."
        items += [(f"{p}attention_norm.weight", (h,), "vision_norm"),
                  (f"{p}ffn_norm.weight", (h,), "vision_norm")]
        items += [(f"{p}attention.{n}_proj.weight", (h, h), "vision") for n in "qkvo"]
        items += [(f"{p}feed_forward.gate_proj.weight", (i, h), "vision"),
                  (f"{p}feed_forward.up_proj.weight", (i, h), "vision"),
                  (f"{p}feed_forward.down_proj.weight", (h, i), "vision")]
    items += [(f"{proj}norm.weight", (h,), "vision_norm"),
              (f"{proj}patch_merger.merging_layer.weight", (h, h * merge * merge), "vision"),
              (f"{proj}linear_1.weight", (text_hidden, h), "vision"),
              (f"{proj}linear_2.weight", (text_hidden, text_hidden), "vision")]
    return [SynthTensor(TensorEntry(name, torch.bfloat16, shape), name, kind, 0.02)
            for name, shape, kind in items]
