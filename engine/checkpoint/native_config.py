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
from engine.checkpoint.generation import special_ids
from engine.config import ConfigError, ModelConfig, QuantConfig, RopeConfig
from engine.kernels.base import ScaleKind

NATIVE_ARCHITECTURE = "Ministral3ForCausalLM"  # the text decoder params.json describes


def parse_native_rope(p: dict[str, Any]) -> RopeConfig:
    theta = float(p.get("rope_theta", 10000.0))
    l4 = p.get("llama_4_scaling") or {}
    beta = float(l4.get("beta") or 0.0)
    yarn = p.get("yarn")
    kw: dict[str, Any] = {"theta": theta, "llama_4_scaling_beta": beta}
    original = l4.get("original_max_position_embeddings")
    if yarn:
        original = yarn.get("original_max_position_embeddings", original)
        kw.update(rope_type="yarn", factor=float(yarn.get("factor", 1.0)),
                  beta_fast=float(yarn.get("beta", 32.0)), beta_slow=float(yarn.get("alpha", 1.0)),
                  mscale=1.0, mscale_all_dim=1.0)
    if original is not None:
        kw["original_max_position_embeddings"] = int(original)
    return RopeConfig(**kw)


def parse_native_quant(p: dict[str, Any]) -> QuantConfig:
    q = p.get("quantization")
    if not q:
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
    bos, eos = special_ids(model_dir, {}, NATIVE_PARAMS)
    try:
        heads = int(p["n_heads"])
        return ModelConfig(
            architecture=NATIVE_ARCHITECTURE,
            hidden_size=int(p["dim"]),
            intermediate_size=int(p["hidden_dim"]),
            num_layers=int(p["n_layers"]),
            num_heads=heads,
            num_kv_heads=int(p.get("n_kv_heads") or heads),
            head_dim=int(p.get("head_dim") or int(p["dim"]) // heads),
            vocab_size=int(p["vocab_size"]),
            rms_norm_eps=float(p.get("norm_eps", 1e-5)),
            max_position_embeddings=int(p.get("max_position_embeddings")
                                        or p.get("max_seq_len") or 32768),
            tie_word_embeddings=p.get("tied_embeddings", False),
            rope=parse_native_rope(p),
            quant=parse_native_quant(p),
            bos_token_id=bos,
            eos_token_ids=eos,
            has_vision=bool(p.get("vision_encoder") or p.get("multimodal")),
        )
    except KeyError as exc:
        raise CheckpointError(f"{NATIVE_PARAMS}: missing field {exc.args[0]!r}") from None
    except (ConfigError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{NATIVE_PARAMS}: {exc}") from None
