"""VisionConfig: the Pixtral tower + projector of a multimodal checkpoint, parsed from
config.json's ``vision_config`` (Hugging Face) or params.json's ``vision_encoder``
(Mistral-native). No tensors are read.

HF fields: vision_config {hidden_size, intermediate_size, num_hidden_layers,
num_attention_heads, patch_size, image_size, rope_theta | rope_parameters.rope_theta,
num_channels, hidden_act (default gelu, as PixtralConfig; engine/vision/activation.py)},
top level spatial_merge_size, projector_hidden_act
(gelu), multimodal_projector_bias (false), vision_feature_layer (-1), image_token_index;
the projector norm's eps is text_config.rms_norm_eps.
Native fields: vision_encoder {hidden_size, intermediate_size, num_hidden_layers,
num_attention_heads, patch_size, image_size, max_image_size, rope_theta, num_channels,
spatial_merge_size, adapter_bias, add_pre_mm_projector_layer_norm, mm_projector_id,
image_token_id}; eps 1e-5 throughout."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.checkpoint.detect import HF_CONFIG, NATIVE_PARAMS, Layout, detect_layout, read_json
from engine.checkpoint.errors import CheckpointError
from engine.vision.activation import ACTIVATIONS


@dataclass(frozen=True, slots=True)
class VisionConfig:
    hidden_size: int  # D, the tower's width
    intermediate_size: int  # I, the tower's SwiGLU width
    num_layers: int
    num_heads: int
    patch_size: int  # P: patch_conv kernel = stride
    image_size: int  # the longest image edge the model takes, pixels (1540)
    text_hidden_size: int  # the projector's output width (the text model's H)
    rope_theta: float = 10000.0
    num_channels: int = 3
    spatial_merge_size: int = 2  # the patch merger's unfold (2x2)
    eps: float = 1e-5  # ln_pre, attention_norm, ffn_norm
    projector_eps: float = 1e-5  # multi_modal_projector.norm
    image_token_id: int = 10  # from the config; the tokenizer's [IMG] must agree
    hidden_act: str = "silu"  # the tower MLP's activation (engine/vision/activation.py)

    def __post_init__(self) -> None:
        sizes = ("hidden_size", "intermediate_size", "num_layers", "num_heads", "patch_size",
                 "image_size", "text_hidden_size", "spatial_merge_size")
        for name in sizes:
            if getattr(self, name) <= 0:
                raise ValueError(f"vision config: {name} must be > 0")
        if self.hidden_size % self.num_heads:
            raise ValueError(f"vision config: hidden_size {self.hidden_size} is not a "
                             f"multiple of num_attention_heads {self.num_heads}")
        if self.head_dim % 4:
            raise ValueError(f"vision config: head_dim {self.head_dim} must be a multiple "
                             "of 4 (2D RoPE splits it into row and column halves)")
        if self.num_channels != 3:
            raise ValueError(f"vision config: num_channels {self.num_channels} (RGB only)")
        if self.hidden_act not in ACTIVATIONS:
            raise ValueError(f"vision config: hidden_act {self.hidden_act!r} is not served "
                             f"(served: {', '.join(ACTIVATIONS)})")

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def max_patches_per_side(self) -> int:
        """The side of the 2D RoPE table: image_size // patch_size (110)."""
        return self.image_size // self.patch_size

    @property
    def token_pixels(self) -> int:
        """Pixels per image token along each side: patch x merge (28)."""
        return self.patch_size * self.spatial_merge_size


TEXT_ONLY = "serve the text model without images: --limit-mm-per-prompt image=0"


def _check(ok: bool, file: str, msg: str) -> None:
    if not ok:
        raise CheckpointError(f"{file}: {msg}; {TEXT_ONLY}")


def parse_hf_vision(cfg: dict[str, Any]) -> VisionConfig:
    v = cfg["vision_config"]
    text = cfg.get("text_config") or {}
    _check(cfg.get("projector_hidden_act", "gelu") == "gelu", HF_CONFIG,
           f"projector_hidden_act {cfg.get('projector_hidden_act')!r} unsupported (gelu)")
    _check(not cfg.get("multimodal_projector_bias", False), HF_CONFIG,
           "multimodal_projector_bias true unsupported")
    _check(cfg.get("vision_feature_layer", -1) == -1, HF_CONFIG,
           f"vision_feature_layer {cfg.get('vision_feature_layer')!r} unsupported (-1)")
    theta = (v.get("rope_parameters") or {}).get("rope_theta", v.get("rope_theta", 10000.0))
    return VisionConfig(
        hidden_size=int(v["hidden_size"]), intermediate_size=int(v["intermediate_size"]),
        num_layers=int(v["num_hidden_layers"]), num_heads=int(v["num_attention_heads"]),
        patch_size=int(v["patch_size"]), image_size=int(v["image_size"]),
        text_hidden_size=int(text["hidden_size"]), rope_theta=float(theta),
        num_channels=int(v.get("num_channels", 3)),
        spatial_merge_size=int(cfg.get("spatial_merge_size", 2)),
        projector_eps=float(text.get("rms_norm_eps", 1e-5)),
        image_token_id=int(cfg.get("image_token_index", cfg.get("image_token_id", 10))),
        hidden_act=str(v.get("hidden_act", "gelu")))  # PixtralConfig's default


def parse_native_vision(p: dict[str, Any]) -> VisionConfig:
    v = p["vision_encoder"]
    _check(not v.get("adapter_bias", False), NATIVE_PARAMS,
           "vision_encoder.adapter_bias true unsupported")
    _check(v.get("mm_projector_id", "patch_merge") == "patch_merge", NATIVE_PARAMS,
           f"vision_encoder.mm_projector_id {v.get('mm_projector_id')!r} unsupported")
    _check(v.get("add_pre_mm_projector_layer_norm", True), NATIVE_PARAMS,
           "vision_encoder.add_pre_mm_projector_layer_norm false unsupported")
    return VisionConfig(
        hidden_size=int(v["hidden_size"]), intermediate_size=int(v["intermediate_size"]),
        num_layers=int(v["num_hidden_layers"]), num_heads=int(v["num_attention_heads"]),
        patch_size=int(v["patch_size"]),
        image_size=int(v.get("max_image_size") or v["image_size"]),
        text_hidden_size=int(p["dim"]), rope_theta=float(v.get("rope_theta", 10000.0)),
        num_channels=int(v.get("num_channels", 3)),
        spatial_merge_size=int(v.get("spatial_merge_size", 2)),
        image_token_id=int(v.get("image_token_id", 10)))


def read_vision_config(model_dir: Path, layout: Layout | str | None = None
                       ) -> VisionConfig | None:
    """The checkpoint's vision config; None for a text-only checkpoint (``layout``: as
    engine/loader.py's)."""
    layout = detect_layout(Path(model_dir), layout)
    file = NATIVE_PARAMS if layout is Layout.NATIVE else HF_CONFIG
    data = read_json(Path(model_dir) / file)
    key = "vision_encoder" if layout is Layout.NATIVE else "vision_config"
    if not data.get(key):
        return None
    try:
        if layout is Layout.NATIVE:
            return parse_native_vision(data)
        return parse_hf_vision(data)
    except KeyError as exc:
        raise CheckpointError(f"{file}: missing field {key}.{exc.args[0]}; {TEXT_ONLY}"
                              ) from None
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{file}: {exc}; {TEXT_ONLY}") from None
