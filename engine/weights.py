"""The loader's output: every tensor of the text decoder in one canonical layout.

Linear weights are either :class:`Fp8Weight` ([N, K] fp8 + fp32 scale, see
engine/kernels/base.py) or a plain bf16 tensor [N, K] (non-FP8 checkpoints, or modules in
``modules_to_not_convert``). q/k rows are in the half-split RoPE layout (the Hugging Face
layout; Mistral-native and GGUF checkpoints are permuted by the loader).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import ModelConfig
from engine.kernels.base import Fp8Weight

LinearWeight = Fp8Weight | torch.Tensor  # Tensor: bf16 [N, K]

LINEAR_NAMES = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@dataclass(frozen=True, slots=True)
class LayerWeights:
    input_layernorm: torch.Tensor  # [H] bf16
    post_attention_layernorm: torch.Tensor  # [H] bf16
    q_proj: LinearWeight  # [num_heads*head_dim, H]
    k_proj: LinearWeight  # [num_kv_heads*head_dim, H]
    v_proj: LinearWeight  # [num_kv_heads*head_dim, H]
    o_proj: LinearWeight  # [H, num_heads*head_dim]
    gate_proj: LinearWeight  # [I, H]
    up_proj: LinearWeight  # [I, H]
    down_proj: LinearWeight  # [H, I]


@dataclass(frozen=True, slots=True)
class ModelWeights:
    config: ModelConfig
    embed_tokens: torch.Tensor  # [V, H] bf16
    layers: tuple[LayerWeights, ...]
    norm: torch.Tensor  # [H] bf16
    lm_head: LinearWeight | None  # [V, H]; None when tied to embed_tokens
    # static per-layer (k_scale, v_scale) of an FP8 KV cache (HF self_attn.k_scale /
    # v_scale); None = none in the checkpoint (scales computed per token, kv_store.py)
    kv_scales: tuple[tuple[float, float], ...] | None = None
