"""The Pixtral vision tower + multimodal projector of a synthesized Mistral3 checkpoint:
its config block (config.json ``vision_config`` or params.json ``vision_encoder``) and its
tensors (bf16), in the HF names or the Mistral-native ones (engine/vision/weights.py).

Each tensor is drawn from (seed, its HF name without prefix), so both layouts hold the
same model; native wq/wk rows are written interleaved (the inverse of what the loader
undoes). Linear weights have std 1/sqrt(K) (K = fan-in), norms ~1: activations stay of
order one through the tower, so the parity tests see every part of it."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch

from engine.synth.files import TensorEntry
from engine.synth.tensors import SynthTensor
from engine.vision.weights import HF_LAYER, layer_name, vision_names


@dataclass(frozen=True, slots=True)
class VisionShape:
    hidden_size: int = 32
    intermediate_size: int = 64
    num_layers: int = 1
    num_heads: int = 2
    head_dim: int = 16
    patch_size: int = 14
    image_size: int = 56
    hidden_act: str = "silu"  # vision_config.hidden_act (published: silu; PixtralConfig: gelu)


TINY_VISION = VisionShape()
PIXTRAL_VISION = VisionShape(hidden_size=1024, intermediate_size=4096, num_layers=24,
                             num_heads=16, head_dim=64, patch_size=14, image_size=1540)


def vision_config(v: VisionShape) -> dict[str, Any]:
    return {
        "model_type": "pixtral", "hidden_size": v.hidden_size,
        "intermediate_size": v.intermediate_size, "num_hidden_layers": v.num_layers,
        "num_attention_heads": v.num_heads, "head_dim": v.head_dim,
        "patch_size": v.patch_size, "image_size": v.image_size, "num_channels": 3,
        "hidden_act": v.hidden_act, "rope_theta": 10000.0, "attention_dropout": 0.0,
        "initializer_range": 0.02,
    }


def native_vision_params(v: VisionShape, merge: int = 2) -> dict[str, Any]:
    """params.json's ``vision_encoder`` block, as the published native files spell it."""
    return {
        "hidden_size": v.hidden_size, "num_channels": 3, "image_size": v.image_size,
        "max_image_size": v.image_size, "patch_size": v.patch_size,
        "rope_theta": 10000.0, "intermediate_size": v.intermediate_size,
        "num_hidden_layers": v.num_layers, "num_attention_heads": v.num_heads,
        "image_token_id": 10, "image_break_token_id": 12, "image_end_token_id": 13,
        "adapter_bias": False, "spatial_merge_size": merge,
        "add_pre_mm_projector_layer_norm": True, "mm_projector_id": "patch_merge",
    }


def _shapes(v: VisionShape, text_hidden: int, merge: int) -> dict[str, tuple[int, ...]]:
    h, i = v.hidden_size, v.intermediate_size
    return {"patch_conv": (h, 3, v.patch_size, v.patch_size), "ln_pre": (h,),
            "projector_norm": (h,), "merging_layer": (h, h * merge * merge),
            "linear_1": (text_hidden, h), "linear_2": (text_hidden, text_hidden),
            "attention_norm": (h,), "ffn_norm": (h,), "q_proj": (h, h), "k_proj": (h, h),
            "v_proj": (h, h), "o_proj": (h, h), "gate_proj": (i, h), "up_proj": (i, h),
            "down_proj": (h, i)}


def _tensor(disk: str, key: str, shape: tuple[int, ...], heads: int | None) -> SynthTensor:
    if len(shape) == 1:
        return SynthTensor(TensorEntry(disk, torch.bfloat16, shape), key, "vision_norm")
    std = 1.0 / math.sqrt(math.prod(shape[1:]))
    return SynthTensor(TensorEntry(disk, torch.bfloat16, shape), key, "vision", std, heads)


def vision_plan(v: VisionShape, text_hidden: int, prefix: str, merge: int = 2,
                native: bool = False) -> list[SynthTensor]:
    """prefix (HF only): "" (on-disk ``vision_tower.*``) or "model." (``model.vision_tower.*``)."""
    shapes = _shapes(v, text_hidden, merge)
    hf, disk = vision_names(False, ""), vision_names(native, prefix)
    plan = [_tensor(disk[k], hf[k], shapes[k], None) for k in ("patch_conv", "ln_pre")]
    for layer in range(v.num_layers):
        for field in HF_LAYER:
            heads = v.num_heads if native and field in ("q_proj", "k_proj") else None
            plan.append(_tensor(layer_name(native, prefix, layer, field),
                                layer_name(False, "", layer, field), shapes[field], heads))
    plan += [_tensor(disk[k], hf[k], shapes[k], None)
             for k in ("projector_norm", "merging_layer", "linear_1", "linear_2")]
    return plan
