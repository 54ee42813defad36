"""params.json (Mistral-native) -> ModelConfig. No tensors are read.

Mapping (the same one vLLM and transformers use for these files):
``yarn {factor, original_max_position_embeddings, beta -> beta_fast, alpha -> beta_slow}``
with mscale = mscale_all_dim = 1 (so the YaRN attention factor is 1, as in the published
HF configs; ``apply_scale`` does not change that); ``llama_4_scaling {beta,
original_max_position_embeddings}``; ``quantization {qformat_weight: fp8_e4m3}`` means
FP8 per-tensor with static activation scales (``qscale_weight`` / ``qscale_act``, both
dequantization multipliers like HF ``weight_scale_inv`` / ``activation_scale``; transformers
renames qscale_weight to weight_scale_inv, vLLM maps them to weight_scale / input_scale).
The ``output`` head is never quantized in native files (modules_to_not_convert = lm_head)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.checkpoint.detect import NATIVE_PARAMS, read_json
from engine.checkpoint.errors import CheckpointError
from engine.checkpoint.fields import Fields
from engine.checkpoint.generation import special_ids
from engine.config import ConfigError, ModelConfig, QuantConfig, RopeConfig
from engine.kernels.base import ScaleKind

NATIVE_ARCHITECTURE = "Ministral3ForCausalLM"  # the text decoder params.json describes


def parse_native_rope(p: dict[str, Any]) -> RopeConfig:
    f = Fields(p, NATIVE_PARAMS)
    l4 = f.section("llama_4_scaling") or Fields({}, NATIVE_PARAMS, "llama_4_scaling.")
    kw: dict[str, Any] = {"theta": f.number("rope_theta", 10000.0),
                          "llama_4_scaling_beta": l4.number("beta", 0.0)}
    original = (l4.integer("original_max_position_embeddings")
                if l4.has("original_max_position_embeddings") else None)
    yarn = f.section("yarn")
    if yarn is not None:
        if yarn.has("original_max_position_embeddings"):
            original = yarn.integer("original_max_position_embeddings")
        kw.update(rope_type="yarn", factor=yarn.number("factor", 1.0),
                  beta_fast=yarn.number("beta", 32.0), beta_slow=yarn.number("alpha", 1.0),
                  mscale=1.0, mscale_all_dim=1.0)
    if original is not None:
        kw["original_max_position_embeddings"] = original
    return RopeConfig(**kw)


def parse_native_quant(p: dict[str, Any]) -> QuantConfig:
    q = Fields(p, NATIVE_PARAMS).section("quantization")
    if q is None:
        return QuantConfig(method="none")
    fmt = q.get("qformat_weight")
    if fmt != "fp8_e4m3":
        raise CheckpointError(f"{NATIVE_PARAMS}: quantization.qformat_weight {fmt!r} unsupported")
    scheme = q.get("qscheme_act", "TENSOR")
    return QuantConfig(method="fp8", scale_kind=ScaleKind.PER_TENSOR,
                       activation_scheme="static" if scheme == "TENSOR" else "dynamic",
                       modules_to_not_convert=("lm_head",))


def parse_native_config(model_dir: Path) -> ModelConfig:
    p = read_json(Path(model_dir) / NATIVE_PARAMS)
    f = Fields(p, NATIVE_PARAMS)
    bos, eos = special_ids(model_dir, {}, NATIVE_PARAMS, f.integer("vocab_size"))
    heads = f.integer("n_heads")
    dim = f.integer("dim")
    max_pos = (f.integer("max_position_embeddings") if f.has("max_position_embeddings")
               else f.integer("max_seq_len", 32768))
    try:
        return ModelConfig(
            architecture=NATIVE_ARCHITECTURE,
            hidden_size=dim,
            intermediate_size=f.integer("hidden_dim"),
            num_layers=f.integer("n_layers"),
            num_heads=heads,
            num_kv_heads=f.integer("n_kv_heads", heads),
            head_dim=f.integer("head_dim", dim // heads if heads > 0 else 0),
            vocab_size=f.integer("vocab_size"),
            rms_norm_eps=f.number("norm_eps", 1e-5),
            max_position_embeddings=max_pos,
            tie_word_embeddings=f.flag("tied_embeddings", False),
            rope=parse_native_rope(p),
            quant=parse_native_quant(p),
            bos_token_id=bos,
            eos_token_ids=eos,
            has_vision=bool(p.get("vision_encoder") or p.get("multimodal")),
            sliding_window=f.integer("sliding_window") if f.has("sliding_window") else None,
        )
    except ConfigError as exc:
        raise CheckpointError(f"{NATIVE_PARAMS}: {exc}") from None
