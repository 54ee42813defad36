"""Shared builders for the model/runner tests: tiny random in-memory ModelWeights (FP8 or
bf16) and the matching transformers Ministral3 reference in fp32 built from the same
(dequantized) tensors. No tests live here."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from engine.config import EngineConfig, ModelConfig, QuantConfig, RopeConfig
from engine.hardware import HardwareInfo
from engine.kernels.base import FP8_DTYPE, FP8_MAX, Fp8Weight, ScaleKind
from engine.kernels.reference import dequantize
from engine.kernels.registry import KernelOverrides
from engine.runner import ModelRunner
from engine.weights import LINEAR_NAMES, LayerWeights, LinearWeight, ModelWeights

YARN = RopeConfig(theta=1e6, rope_type="yarn", factor=16.0, original_max_position_embeddings=8,
                  beta_fast=32.0, beta_slow=1.0, mscale=1.0, mscale_all_dim=1.0,
                  llama_4_scaling_beta=0.1)


def tiny_config(rope: RopeConfig = YARN, quant: str = "fp8", tied: bool = False,
                **kw: object) -> ModelConfig:
    base: dict[str, object] = dict(
        architecture="Ministral3ForCausalLM", hidden_size=64, intermediate_size=160,
        num_layers=2, num_heads=4, num_kv_heads=2, head_dim=32, vocab_size=320,
        max_position_embeddings=4096, tie_word_embeddings=tied, rope=rope,
        quant=QuantConfig(method=quant))
    base.update(kw)
    return ModelConfig(**base)  # type: ignore[arg-type]


def quantize_fp8(w: torch.Tensor, kind: ScaleKind = ScaleKind.PER_TENSOR,
                 act_scale: float | None = 0.05, block: int = 128) -> Fp8Weight:
    """fp32 [N, K] -> Fp8Weight with amax/448 scales (per-tensor, per-channel or square
    blocks of `block`)."""
    if kind is ScaleKind.PER_TENSOR:
        scale = (w.abs().max() / FP8_MAX).reshape(())
        q = (w / scale).to(FP8_DTYPE)
    elif kind is ScaleKind.PER_CHANNEL:
        scale = w.abs().amax(1) / FP8_MAX
        q = (w / scale[:, None]).to(FP8_DTYPE)
    else:
        n, k, b = *w.shape, block
        pad = torch.zeros(-(-n // b) * b, -(-k // b) * b)
        pad[:n, :k] = w
        blocks = pad.view(pad.shape[0] // b, b, pad.shape[1] // b, b)
        scale = blocks.abs().amax((1, 3)).clamp_min(1e-8) / FP8_MAX
        full = scale.repeat_interleave(b, 0).repeat_interleave(b, 1)[:n, :k]
        q = (w / full).to(FP8_DTYPE)
    act = None if act_scale is None else torch.tensor(act_scale, dtype=torch.float32)
    return Fp8Weight(q.contiguous(), scale.float().contiguous(), kind, act, (block, block))


def random_weights(config: ModelConfig, seed: int = 0, kind: ScaleKind = ScaleKind.PER_TENSOR,
                   fp8_head: bool = False, block: int = 128) -> ModelWeights:
    g = torch.Generator().manual_seed(seed)
    c = config
    shapes = {"q_proj": (c.q_size, c.hidden_size), "k_proj": (c.kv_size, c.hidden_size),
              "v_proj": (c.kv_size, c.hidden_size), "o_proj": (c.hidden_size, c.q_size),
              "gate_proj": (c.intermediate_size, c.hidden_size),
              "up_proj": (c.intermediate_size, c.hidden_size),
              "down_proj": (c.hidden_size, c.intermediate_size)}

    def linear(n: int, k: int) -> LinearWeight:
        w = torch.randn(n, k, generator=g) * (1.5 / k ** 0.5)
        return (quantize_fp8(w, kind, block=block) if c.quant.method == "fp8"
                else w.to(torch.bfloat16))

    def norm() -> torch.Tensor:
        return (1.0 + 0.2 * torch.randn(c.hidden_size, generator=g)).to(torch.bfloat16)

    layers = tuple(
        LayerWeights(norm(), norm(), **{name: linear(*shapes[name]) for name in LINEAR_NAMES})
        for _ in range(c.num_layers))
    embed = torch.randn(c.vocab_size, c.hidden_size, generator=g).to(torch.bfloat16)
    head: LinearWeight | None = None
    if not c.tie_word_embeddings:
        head_f = torch.randn(c.vocab_size, c.hidden_size, generator=g) * 0.1
        head = quantize_fp8(head_f, kind) if fp8_head else head_f.to(torch.bfloat16)
    return ModelWeights(c, embed, layers, norm(), head)


def _fp32(w: LinearWeight) -> torch.Tensor:
    return dequantize(w) if isinstance(w, Fp8Weight) else w.float()


def hf_rope_parameters(rope: RopeConfig) -> dict[str, object]:
    out: dict[str, object] = {
        "rope_type": rope.rope_type, "rope_theta": rope.theta,
        "original_max_position_embeddings": rope.original_max_position_embeddings,
        "llama_4_scaling_beta": rope.llama_4_scaling_beta}
    if rope.rope_type == "yarn":
        out.update(factor=rope.factor, beta_fast=rope.beta_fast, beta_slow=rope.beta_slow,
                   mscale=rope.mscale, mscale_all_dim=rope.mscale_all_dim,
                   truncate=rope.truncate)
        if rope.attention_factor is not None:
            out["attention_factor"] = rope.attention_factor
    return out


def hf_reference(weights: ModelWeights) -> torch.nn.Module:
    """transformers Ministral3ForCausalLM in fp32 holding the dequantized weights."""
    from transformers import Ministral3Config, Ministral3ForCausalLM

    c = weights.config
    hf_cfg = Ministral3Config(
        vocab_size=c.vocab_size, hidden_size=c.hidden_size,
        intermediate_size=c.intermediate_size, num_hidden_layers=c.num_layers,
        num_attention_heads=c.num_heads, num_key_value_heads=c.num_kv_heads,
        head_dim=c.head_dim, max_position_embeddings=c.max_position_embeddings,
        rms_norm_eps=c.rms_norm_eps, tie_word_embeddings=c.tie_word_embeddings,
        rope_parameters=hf_rope_parameters(c.rope))
    hf_cfg._attn_implementation = "eager"
    model = Ministral3ForCausalLM(hf_cfg).float().eval()
    sd = {"model.embed_tokens.weight": weights.embed_tokens.float(),
          "model.norm.weight": weights.norm.float(),
          "lm_head.weight": _fp32(weights.lm_head if weights.lm_head is not None
                                  else weights.embed_tokens)}
    for i, lw in enumerate(weights.layers):
        p = f"model.layers.{i}."
        sd[p + "input_layernorm.weight"] = lw.input_layernorm.float()
        sd[p + "post_attention_layernorm.weight"] = lw.post_attention_layernorm.float()
        for name in LINEAR_NAMES:
            sub = "self_attn" if name in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            sd[f"{p}{sub}.{name}.weight"] = _fp32(getattr(lw, name))
    missing, unexpected = model.load_state_dict(sd, strict=False)
    assert not unexpected and all("rotary" in m for m in missing), (missing, unexpected)
    return model


def hf_logits(model: torch.nn.Module, ids: list[int]) -> torch.Tensor:
    """fp32 [len(ids), V]"""
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0].float()


def engine_config(**kw: object) -> EngineConfig:
    base: dict[str, object] = dict(model_dir=Path("."), kv_cache_gib=0.01, kv_block_size=4,
                                   max_model_len=256)
    base.update(kw)
    return EngineConfig(**base)  # type: ignore[arg-type]


def make_runner(weights: ModelWeights, **kw: object) -> ModelRunner:
    return ModelRunner(weights, engine_config(**kw), HardwareInfo.fake(), KernelOverrides())


def with_rope(config: ModelConfig, **rope_kw: object) -> ModelConfig:
    return replace(config, rope=replace(config.rope, **rope_kw))


def logit_error(ours: torch.Tensor, ref: torch.Tensor) -> float:
    """max |ours - ref| / max |ref|: the error relative to the logit scale."""
    return float((ours - ref).abs().max() / ref.abs().max())
