"""VisionWeights: every tensor of the Pixtral tower and the projector in one canonical
layout, loaded from either checkpoint layout.

All bf16 (fp16/fp32 files are converted once). Memory-mapped as stored, except q/k/v
and gate/up: each layer's are concatenated at load into one [3D, D] and one [2I, D]
weight (one GEMM each instead of three and two), and the file pages the copy read are
released (engine/vision/mapped_pages.py), so the tower holds one copy. q/k rows are in
the half-split RoPE layout (HF); Mistral-native wq/wk (interleaved complex pairs) are
permuted by :func:`load_vision_weights`, like the text wq/wk (engine/checkpoint/assemble.py).

Names on disk (HF prefix ``""`` or ``"model."`` | native):
    vision_tower.patch_conv.weight            | vision_encoder.patch_conv.weight
    vision_tower.ln_pre.weight                | vision_encoder.ln_pre.weight
    vision_tower.transformer.layers.{i}.      | vision_encoder.transformer.layers.{i}.
        attention_norm / ffn_norm .weight     |     attention_norm / ffn_norm .weight
        attention.{q,k,v,o}_proj.weight       |     attention.w{q,k,v,o}.weight
        feed_forward.{gate,up,down}_proj      |     feed_forward.w1 / w3 / w2
    multi_modal_projector.norm.weight         | pre_mm_projector_norm.weight
    multi_modal_projector.patch_merger.merging_layer.weight | patch_merger.merging_layer.weight
    multi_modal_projector.linear_1 / linear_2 | vision_language_adapter.w_in / w_out
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.checkpoint.assemble import interleaved_to_half_split
from engine.checkpoint.tensors import TensorStore
from engine.checkpoint.validate import read_float
from engine.vision.config import VisionConfig
from engine.vision.mapped_pages import release_mapped_pages


@dataclass(frozen=True, slots=True)
class VisionLayerWeights:
    attention_norm: torch.Tensor  # [D] bf16
    ffn_norm: torch.Tensor  # [D] bf16
    qkv_proj: torch.Tensor  # [3D, D] bf16: rows q | k | v; q, k rows half-split per head
    o_proj: torch.Tensor  # [D, D] bf16
    gate_up_proj: torch.Tensor  # [2I, D] bf16: rows gate | up
    down_proj: torch.Tensor  # [D, I] bf16

    def __post_init__(self) -> None:
        d = self.o_proj.shape[0]
        if self.qkv_proj.shape != (3 * d, d) or self.gate_up_proj.shape[0] % 2:
            raise ValueError(f"qkv_proj {list(self.qkv_proj.shape)} / gate_up_proj "
                             f"{list(self.gate_up_proj.shape)} are not fused [3D, D] / [2I, D]")

    def part(self, name: str) -> torch.Tensor:
        """One of the unfused weights as a view: q_proj, k_proj, v_proj ([D, D]) or
        gate_proj, up_proj ([I, D])."""
        d, i = self.o_proj.shape[0], self.gate_up_proj.shape[0] // 2
        spans = {"q_proj": (self.qkv_proj, 0, d), "k_proj": (self.qkv_proj, d, d),
                 "v_proj": (self.qkv_proj, 2 * d, d), "gate_proj": (self.gate_up_proj, 0, i),
                 "up_proj": (self.gate_up_proj, i, i)}
        w, start, rows = spans[name]
        return w[start:start + rows]


@dataclass(frozen=True, slots=True)
class VisionWeights:
    config: VisionConfig
    patch_conv: torch.Tensor  # [D, 3, P, P] bf16
    ln_pre: torch.Tensor  # [D] bf16
    layers: tuple[VisionLayerWeights, ...]
    projector_norm: torch.Tensor  # [D] bf16
    merging_layer: torch.Tensor  # [D, D*m*m] bf16, columns c*m*m + ki*m + kj
    linear_1: torch.Tensor  # [H, D] bf16
    linear_2: torch.Tensor  # [H, H] bf16

    def __post_init__(self) -> None:
        if len(self.layers) != self.config.num_layers:
            raise ValueError(f"{len(self.layers)} vision layers, config says "
                             f"{self.config.num_layers}")

    @property
    def nbytes(self) -> int:
        tensors = [self.patch_conv, self.ln_pre, self.projector_norm, self.merging_layer,
                   self.linear_1, self.linear_2]
        tensors += [getattr(lw, f) for lw in self.layers for f in lw.__dataclass_fields__]
        return sum(t.numel() * t.element_size() for t in tensors)


HF_LAYER = {"attention_norm": "attention_norm", "ffn_norm": "ffn_norm",
            "q_proj": "attention.q_proj", "k_proj": "attention.k_proj",
            "v_proj": "attention.v_proj", "o_proj": "attention.o_proj",
            "gate_proj": "feed_forward.gate_proj", "up_proj": "feed_forward.up_proj",
            "down_proj": "feed_forward.down_proj"}
NATIVE_LAYER = {"attention_norm": "attention_norm", "ffn_norm": "ffn_norm",
                "q_proj": "attention.wq", "k_proj": "attention.wk", "v_proj": "attention.wv",
                "o_proj": "attention.wo", "gate_proj": "feed_forward.w1",
                "up_proj": "feed_forward.w3", "down_proj": "feed_forward.w2"}


def vision_names(native: bool, prefix: str = "") -> dict[str, str]:
    """Canonical -> on-disk name of the non-layer tensors; layer names via layer_name."""
    if native:
        return {"patch_conv": "vision_encoder.patch_conv.weight",
                "ln_pre": "vision_encoder.ln_pre.weight",
                "projector_norm": "pre_mm_projector_norm.weight",
                "merging_layer": "patch_merger.merging_layer.weight",
                "linear_1": "vision_language_adapter.w_in.weight",
                "linear_2": "vision_language_adapter.w_out.weight"}
    t, p = f"{prefix}vision_tower.", f"{prefix}multi_modal_projector."
    return {"patch_conv": f"{t}patch_conv.weight", "ln_pre": f"{t}ln_pre.weight",
            "projector_norm": f"{p}norm.weight",
            "merging_layer": f"{p}patch_merger.merging_layer.weight",
            "linear_1": f"{p}linear_1.weight", "linear_2": f"{p}linear_2.weight"}


def layer_name(native: bool, prefix: str, i: int, field: str) -> str:
    if native:
        return f"vision_encoder.transformer.layers.{i}.{NATIVE_LAYER[field]}.weight"
    return f"{prefix}vision_tower.transformer.layers.{i}.{HF_LAYER[field]}.weight"


def hf_vision_prefix(store: TensorStore) -> str:
    """"" (``vision_tower.*``, the published files) or "model." (transformers 5 names)."""
    return "model." if "model.vision_tower.patch_conv.weight" in store else ""


FUSED = {"qkv_proj": ("q_proj", "k_proj", "v_proj"), "gate_up_proj": ("gate_proj", "up_proj")}


def _fused(store: TensorStore, c: VisionConfig, native: bool, prefix: str, i: int,
           parts: tuple[str, ...]) -> torch.Tensor:
    """The parts' rows concatenated ([sum rows, D] bf16); the mapped pages they were read
    from are released (a bf16 file tensor is the mapping itself; others were converted)."""
    d, inter = c.hidden_size, c.intermediate_size
    read = []
    for field in parts:
        name = layer_name(native, prefix, i, field)
        t = read_float(store, name, (d if field in FUSED["qkv_proj"] else inter, d))
        mapped = t if store.meta(name).dtype == torch.bfloat16 else None
        if native and field in ("q_proj", "k_proj"):
            t = interleaved_to_half_split(t, c.num_heads)
        read.append((t, mapped))
    out = torch.cat([t for t, _ in read])
    for _, mapped in read:
        if mapped is not None:
            release_mapped_pages(mapped)
    return out


def _layer(store: TensorStore, c: VisionConfig, native: bool, prefix: str,
           i: int) -> VisionLayerWeights:
    d, inter = c.hidden_size, c.intermediate_size
    shapes = {"attention_norm": (d,), "ffn_norm": (d,), "o_proj": (d, d),
              "down_proj": (d, inter)}
    out = {f: read_float(store, layer_name(native, prefix, i, f), s) for f, s in shapes.items()}
    for field, parts in FUSED.items():
        out[field] = _fused(store, c, native, prefix, i, parts)
    return VisionLayerWeights(**out)


def load_vision_weights(store: TensorStore, c: VisionConfig, native: bool) -> VisionWeights:
    """Read and check every vision tensor (CheckpointError naming the file and tensor)."""
    prefix = "" if native else hf_vision_prefix(store)
    names = vision_names(native, prefix)
    d, h, p, m = c.hidden_size, c.text_hidden_size, c.patch_size, c.spatial_merge_size
    shapes = {"patch_conv": (d, c.num_channels, p, p), "ln_pre": (d,), "projector_norm": (d,),
              "merging_layer": (d, d * m * m), "linear_1": (h, d), "linear_2": (h, h)}
    top = {k: read_float(store, names[k], s) for k, s in shapes.items()}
    layers = tuple(_layer(store, c, native, prefix, i) for i in range(c.num_layers))
    return VisionWeights(config=c, layers=layers, **top)
