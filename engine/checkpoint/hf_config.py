"""config.json (Hugging Face) -> ModelConfig. No tensors are read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.checkpoint.detect import HF_CONFIG, read_json
from engine.checkpoint.errors import CheckpointError
from engine.checkpoint.generation import special_ids
from engine.config import ConfigError, ModelConfig, QuantConfig, RopeConfig
from engine.kernels.base import DEFAULT_BLOCK, ScaleKind

TEXT_MODEL_TYPES = ("ministral3", "mistral", "llama")
ARCHITECTURES = (
    "Mistral3ForConditionalGeneration",
    "Ministral3ForCausalLM",
    "MistralForCausalLM",
    "LlamaForCausalLM",
)
YARN_KEYS = ("factor", "original_max_position_embeddings", "beta_fast", "beta_slow",
             "mscale", "mscale_all_dim")


def _architecture(cfg: dict[str, Any]) -> str:
    archs = cfg.get("architectures") or []
    arch = archs[0] if archs else None
    model_type = cfg.get("model_type")
    known_type = model_type == "mistral3" or model_type in TEXT_MODEL_TYPES
    if (arch is not None and arch not in ARCHITECTURES) or not known_type:
        raise CheckpointError(
            f"{HF_CONFIG}: unknown architecture {arch!r} (model_type {model_type!r}); "
            f"supported: {', '.join(ARCHITECTURES)}"
        )
    return arch or {"mistral3": ARCHITECTURES[0], "ministral3": ARCHITECTURES[1],
                    "mistral": ARCHITECTURES[2], "llama": ARCHITECTURES[3]}[model_type]


def _text_config(cfg: dict[str, Any]) -> dict[str, Any]:
    if cfg.get("model_type") != "mistral3":
        return cfg
    text = cfg.get("text_config")
    if not isinstance(text, dict):
        raise CheckpointError(f"{HF_CONFIG}: model_type mistral3 without a text_config")
    if text.get("model_type", "ministral3") not in TEXT_MODEL_TYPES:
        raise CheckpointError(
            f"{HF_CONFIG}: unknown architecture: text_config.model_type "
            f"{text.get('model_type')!r}; supported: {', '.join(TEXT_MODEL_TYPES)}"
        )
    return text


def parse_rope(text: dict[str, Any]) -> RopeConfig:
    """transformers 5 ``rope_parameters`` or legacy ``rope_scaling`` + ``rope_theta``."""
    params = dict(text.get("rope_parameters") or text.get("rope_scaling") or {})
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "yarn"):
        raise CheckpointError(f"{HF_CONFIG}: rope_type {rope_type!r} unsupported (default, yarn)")
    theta = params.get("rope_theta", text.get("rope_theta", 10000.0))
    beta = params.get("llama_4_scaling_beta", text.get("llama_4_scaling_beta")) or 0.0
    kw: dict[str, Any] = {"theta": float(theta), "rope_type": rope_type,
                          "llama_4_scaling_beta": float(beta)}
    original = params.get("original_max_position_embeddings")
    if original is None and (rope_type == "yarn" or beta):
        original = text.get("max_position_embeddings")
    if original is not None:
        kw["original_max_position_embeddings"] = int(original)
    if rope_type == "yarn":
        for key in YARN_KEYS[2:]:
            if params.get(key) is not None:
                kw[key] = float(params[key])
        factor = params.get("factor")
        if factor is None and original:
            factor = text.get("max_position_embeddings", original) / original
        kw["factor"] = 1.0 if factor is None else float(factor)
    return RopeConfig(**kw)


def parse_quant(cfg: dict[str, Any], text: dict[str, Any]) -> QuantConfig:
    q = cfg.get("quantization_config") or text.get("quantization_config")
    if not q:
        return QuantConfig(method="none")
    method = q.get("quant_method")
    if method != "fp8":
        raise CheckpointError(f"{HF_CONFIG}: quantization_config.quant_method {method!r} "
                              "unsupported (fp8, or none for bf16)")
    block = q.get("weight_block_size")
    if block is not None and (len(block) != 2 or min(block) <= 0):
        raise CheckpointError(f"{HF_CONFIG}: weight_block_size {block!r} must be [bn, bk] or null")
    return QuantConfig(
        method="fp8",
        scale_kind=ScaleKind.PER_TENSOR if block is None else ScaleKind.BLOCK,
        block_size=DEFAULT_BLOCK if block is None else (int(block[0]), int(block[1])),
        activation_scheme=q.get("activation_scheme", "static"),
        modules_to_not_convert=tuple(q.get("modules_to_not_convert") or ()),
    )


def parse_hf_config(model_dir: Path) -> ModelConfig:
    cfg = read_json(Path(model_dir) / HF_CONFIG)
    arch = _architecture(cfg)
    text = _text_config(cfg)
    bos, eos = special_ids(model_dir, text, HF_CONFIG)
    tied = text.get("tie_word_embeddings", cfg.get("tie_word_embeddings", False))
    act = text.get("hidden_act", text.get("hidden_activation", "silu"))
    if act != "silu":
        raise CheckpointError(f"{HF_CONFIG}: hidden_act {act!r} unsupported (the MLP is "
                              "SiLU-gated: silu)")
    try:
        heads = int(text["num_attention_heads"])
        return ModelConfig(
            architecture=arch,
            hidden_size=int(text["hidden_size"]),
            intermediate_size=int(text["intermediate_size"]),
            num_layers=int(text["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(text.get("num_key_value_heads") or heads),
            head_dim=int(text.get("head_dim") or int(text["hidden_size"]) // heads),
            vocab_size=int(text["vocab_size"]),
            rms_norm_eps=float(text.get("rms_norm_eps", 1e-5)),
            max_position_embeddings=int(text.get("max_position_embeddings", 32768)),
            tie_word_embeddings=tied,
            rope=parse_rope(text),
            quant=parse_quant(cfg, text),
            bos_token_id=bos,
            eos_token_ids=eos,
            has_vision="vision_config" in cfg,
        )
    except KeyError as exc:
        raise CheckpointError(f"{HF_CONFIG}: missing field {exc.args[0]!r}") from None
    except (ConfigError, TypeError, ValueError) as exc:
        raise CheckpointError(f"{HF_CONFIG}: {exc}") from None
