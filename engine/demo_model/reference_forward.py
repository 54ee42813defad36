"""A small fp32 forward of a llama-style decoder over Hugging Face-named tensors, used to
calibrate static activation scales (amax of every linear's input) during conversion.

It runs the *quantized* model (FP8 weights dequantized to fp32), so the recorded ranges are
those the served model sees. Plain RoPE, half-split layout, causal GQA attention, SwiGLU.

    tokens [T] int64 -> logits [T, V] fp32; observe(name, x [T, K] fp32) per linear input
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import torch.nn.functional as F

Observer = Callable[[str, torch.Tensor], None]


@dataclass(frozen=True)
class DecoderShape:
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x: torch.Tensor, theta: float) -> torch.Tensor:
    """x [heads, T, D] fp32, positions 0..T-1, half-split rotation."""
    t, d = x.shape[1], x.shape[2]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    ang = torch.arange(t, dtype=torch.float32)[:, None] * inv[None, :]
    cos, sin = ang.cos(), ang.sin()
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def _linear(w: Mapping[str, torch.Tensor], name: str, x: torch.Tensor,
            observe: Observer | None) -> torch.Tensor:
    if observe is not None:
        observe(name, x)
    return x @ w[f"{name}.weight"].T


def _attention(w, p: str, x: torch.Tensor, s: DecoderShape, observe) -> torch.Tensor:
    t = x.shape[0]
    q = _linear(w, f"{p}.q_proj", x, observe).view(t, s.num_heads, s.head_dim).transpose(0, 1)
    k = _linear(w, f"{p}.k_proj", x, observe).view(t, s.num_kv_heads, s.head_dim).transpose(0, 1)
    v = _linear(w, f"{p}.v_proj", x, observe).view(t, s.num_kv_heads, s.head_dim).transpose(0, 1)
    q, k = _rope(q, s.rope_theta), _rope(k, s.rope_theta)
    rep = s.num_heads // s.num_kv_heads
    k, v = k.repeat_interleave(rep, 0), v.repeat_interleave(rep, 0)
    o = F.scaled_dot_product_attention(q[None], k[None], v[None], is_causal=True)[0]
    return _linear(w, f"{p}.o_proj", o.transpose(0, 1).reshape(t, -1), observe)


def _mlp(w, p: str, x: torch.Tensor, observe) -> torch.Tensor:
    g = _linear(w, f"{p}.gate_proj", x, observe)
    u = _linear(w, f"{p}.up_proj", x, observe)
    return _linear(w, f"{p}.down_proj", F.silu(g) * u, observe)


@torch.inference_mode()
def forward(w: Mapping[str, torch.Tensor], shape: DecoderShape, tokens: torch.Tensor,
            observe: Observer | None = None) -> torch.Tensor:
    """w: fp32 tensors by Hugging Face name (tied head: lm_head = embed_tokens)."""
    h = w["model.embed_tokens.weight"][tokens]
    for i in range(shape.num_layers):
        p = f"model.layers.{i}"
        x = _rms(h, w[f"{p}.input_layernorm.weight"], shape.rms_norm_eps)
        h = h + _attention(w, f"{p}.self_attn", x, shape, observe)
        x = _rms(h, w[f"{p}.post_attention_layernorm.weight"], shape.rms_norm_eps)
        h = h + _mlp(w, f"{p}.mlp", x, observe)
    h = _rms(h, w["model.norm.weight"], shape.rms_norm_eps)
    head = w.get("lm_head.weight", w["model.embed_tokens.weight"])
    return h @ head.T


def calibrate(w: Mapping[str, torch.Tensor], shape: DecoderShape,
              prompts: list[list[int]]) -> dict[str, float]:
    """Linear name (``model.layers.i.self_attn.q_proj``) -> amax of its input over prompts."""
    amax: dict[str, float] = {}

    def observe(name: str, x: torch.Tensor) -> None:
        amax[name] = max(amax.get(name, 0.0), float(x.abs().max()))

    for ids in prompts:
        forward(w, shape, torch.tensor(ids, dtype=torch.long), observe)
    return amax
