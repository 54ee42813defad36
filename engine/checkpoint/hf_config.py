"""config.json (Hugging Face) -> ModelConfig. No tensors are read."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.checkpoint.detect import HF_CONFIG, read_json
from engine.checkpoint.errors import CheckpointError
from engine.checkpoint.fields import Fields
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
    if not isinstance(archs, list):  # a string's first letter was read as the name
        raise CheckpointError(f"{HF_CONFIG}: architectures must be a list of names, got "
                              f"{archs!r}")
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
    t = Fields(text, HF_CONFIG)
    key = "rope_parameters" if t.has("rope_parameters") else "rope_scaling"
    params = t.section(key) or Fields({}, HF_CONFIG, f"{key}.")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type not in ("default", "yarn"):
        raise CheckpointError(f"{HF_CONFIG}: rope_type {rope_type!r} unsupported (default, yarn)")
    theta = (params.number("rope_theta") if params.has("rope_theta")
             else t.number("rope_theta", 10000.0))
    beta = (params.number("llama_4_scaling_beta") if params.has("llama_4_scaling_beta")
            else t.number("llama_4_scaling_beta", 0.0))
    kw: dict[str, Any] = {"theta": theta, "rope_type": rope_type, "llama_4_scaling_beta": beta}
    original: int | None = None
    if params.has("original_max_position_embeddings"):
        original = params.integer("original_max_position_embeddings")
    elif (rope_type == "yarn" or beta) and t.has("max_position_embeddings"):
        original = t.integer("max_position_embeddings")
    if original is not None:
        kw["original_max_position_embeddings"] = original
    partial = params.number("partial_rotary_factor", 1.0)
    if partial != 1.0:
        raise CheckpointError(f"{HF_CONFIG}: {key}.partial_rotary_factor {partial:g} "
                              "unsupported (the whole head dimension rotates)")
    if rope_type == "yarn":
        for name in YARN_KEYS[2:]:
            if params.has(name):
                kw[name] = params.number(name)
        if params.get("attention_factor") is not None:
            kw["attention_factor"] = params.number("attention_factor")
        if params.has("truncate"):
            kw["truncate"] = params.flag("truncate", True)
        if params.has("factor"):
            kw["factor"] = params.number("factor")
        elif original:
            kw["factor"] = t.number("max_position_embeddings", original) / original
    return RopeConfig(**kw)


def parse_quant(cfg: dict[str, Any], text: dict[str, Any]) -> QuantConfig:
    key = "quantization_config"
    raw = cfg.get(key) or text.get(key)
    if not raw:
        return QuantConfig(method="none")
    q = Fields(raw, HF_CONFIG, f"{key}.")
    method = q.get("quant_method")
    if method != "fp8":
        raise CheckpointError(f"{HF_CONFIG}: quantization_config.quant_method {method!r} "
                              "unsupported (fp8, or none for bf16)")
    # an absent key reads as transformers' FineGrainedFP8Config reads it: 128 x 128 blocks
    # and dynamic activation scales; an explicit null is per-tensor
    block = q.get("weight_block_size", list(DEFAULT_BLOCK))
    if block is not None and (not isinstance(block, list) or len(block) != 2 or not all(
            isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in block)):
        raise CheckpointError(f"{HF_CONFIG}: quantization_config.weight_block_size {block!r}: "
                              "two integers > 0, [block_n, block_k], or null (per-tensor "
                              "scales)")
    skip = q.get("modules_to_not_convert") or ()
    if not isinstance(skip, list | tuple) or not all(isinstance(m, str) for m in skip):
        raise CheckpointError(f"{HF_CONFIG}: quantization_config.modules_to_not_convert must "
                              f"be a list of names, got {skip!r}")
    scheme = q.get("activation_scheme", "dynamic")
    if scheme not in ("static", "dynamic"):
        raise CheckpointError(f"{HF_CONFIG}: quantization_config.activation_scheme "
                              f"{scheme!r} unsupported (static, dynamic)")
    return QuantConfig(
        method="fp8",
        scale_kind=ScaleKind.PER_TENSOR if block is None else ScaleKind.BLOCK,
        block_size=DEFAULT_BLOCK if block is None else (int(block[0]), int(block[1])),
        activation_scheme=scheme,
        modules_to_not_convert=tuple(skip),
    )


def parse_hf_config(model_dir: Path) -> ModelConfig:
    cfg = read_json(Path(model_dir) / HF_CONFIG)
    arch = _architecture(cfg)
    text = _text_config(cfg)
    t = Fields(text, HF_CONFIG, "text_config." if text is not cfg else "")
    bos, eos = special_ids(model_dir, text, HF_CONFIG, t.integer("vocab_size"))
    tied = (t.flag("tie_word_embeddings", False) if "tie_word_embeddings" in text
            else Fields(cfg, HF_CONFIG).flag("tie_word_embeddings", False))
    act = text.get("hidden_act", text.get("hidden_activation", "silu"))
    if act != "silu":
        raise CheckpointError(f"{HF_CONFIG}: hidden_act {act!r} unsupported (the MLP is "
                              "SiLU-gated: silu)")
    heads = t.integer("num_attention_heads")
    hidden = t.integer("hidden_size")
    try:
        return ModelConfig(
            architecture=arch,
            hidden_size=hidden,
            intermediate_size=t.integer("intermediate_size"),
            num_layers=t.integer("num_hidden_layers"),
            num_heads=heads,
            num_kv_heads=t.integer("num_key_value_heads", heads),
            head_dim=t.integer("head_dim", hidden // heads if heads > 0 else 0),
            vocab_size=t.integer("vocab_size"),
            rms_norm_eps=t.number("rms_norm_eps", 1e-5),
            max_position_embeddings=t.integer("max_position_embeddings", 32768),
            tie_word_embeddings=tied,
            rope=parse_rope(text),
            quant=parse_quant(cfg, text),
            bos_token_id=bos,
            eos_token_ids=eos,
            has_vision="vision_config" in cfg,
            sliding_window=t.integer("sliding_window") if t.has("sliding_window") else None,
        )
    except ConfigError as exc:
        raise CheckpointError(f"{HF_CONFIG}: {exc}") from None
