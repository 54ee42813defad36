"""config.json / params.json contents for a synthesized checkpoint (see engine/synth/checkpoint.py).
The HF configs follow the published Ministral-3 files and load in transformers 5."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from engine.synth.vision import vision_config

if TYPE_CHECKING:
    from engine.synth.spec import SynthSpec

MM_NOT_CONVERT = ["model.vision_tower", "model.multi_modal_projector", "lm_head"]


def rope_parameters(s: SynthSpec) -> dict[str, Any]:
    if s.rope == "default":
        return {"rope_type": "default", "rope_theta": s.rope_theta,
                "llama_4_scaling_beta": s.llama_4_scaling_beta,
                "original_max_position_embeddings": s.original_max_position_embeddings}
    return {"rope_type": "yarn", "rope_theta": s.rope_theta, "factor": s.yarn_factor,
            "original_max_position_embeddings": s.original_max_position_embeddings,
            "max_position_embeddings": s.max_position_embeddings,
            "beta_fast": 32.0, "beta_slow": 1.0, "mscale": 1.0, "mscale_all_dim": 1.0,
            "llama_4_scaling_beta": s.llama_4_scaling_beta}


def quantization_config(s: SynthSpec, not_convert: list[str]) -> dict[str, Any] | None:
    if s.quant == "bf16":
        return None
    block = s.quant == "fp8-block"
    return {"quant_method": "fp8", "activation_scheme": "dynamic" if block else "static",
            "weight_block_size": [128, 128] if block else None,
            "modules_to_not_convert": not_convert}


def text_config(s: SynthSpec) -> dict[str, Any]:
    return {
        "model_type": "ministral3", "hidden_size": s.hidden_size,
        "intermediate_size": s.intermediate_size, "num_hidden_layers": s.num_layers,
        "num_attention_heads": s.num_heads, "num_key_value_heads": s.num_kv_heads,
        "head_dim": s.head_dim, "vocab_size": s.vocab_size, "hidden_act": "silu",
        "rms_norm_eps": s.rms_norm_eps, "max_position_embeddings": s.max_position_embeddings,
        "tie_word_embeddings": s.tie_word_embeddings, "sliding_window": None,
        "attention_dropout": 0.0, "use_cache": True, "initializer_range": 0.02,
        "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 11,
        "rope_parameters": rope_parameters(s), "dtype": "bfloat16",
    }


def hf_text_config(s: SynthSpec) -> dict[str, Any]:
    cfg = {"architectures": ["Ministral3ForCausalLM"], **text_config(s)}
    q = quantization_config(s, ["lm_head"])
    if q:
        cfg["quantization_config"] = q
    return cfg


def hf_multimodal_config(s: SynthSpec) -> dict[str, Any]:
    assert s.vision is not None
    cfg: dict[str, Any] = {
        "architectures": ["Mistral3ForConditionalGeneration"], "model_type": "mistral3",
        "image_token_index": 10, "projector_hidden_act": "gelu", "spatial_merge_size": 2,
        "multimodal_projector_bias": False, "vision_feature_layer": -1,
        "tie_word_embeddings": s.tie_word_embeddings, "dtype": "bfloat16",
        "text_config": text_config(s), "vision_config": vision_config(s.vision),
    }
    q = quantization_config(s, MM_NOT_CONVERT)
    if q:
        cfg["quantization_config"] = q
    return cfg


def native_params(s: SynthSpec) -> dict[str, Any]:
    p: dict[str, Any] = {
        "dim": s.hidden_size, "n_layers": s.num_layers, "head_dim": s.head_dim,
        "hidden_dim": s.intermediate_size, "n_heads": s.num_heads, "n_kv_heads": s.num_kv_heads,
        "rope_theta": s.rope_theta, "norm_eps": s.rms_norm_eps, "vocab_size": s.vocab_size,
        "tied_embeddings": s.tie_word_embeddings,
        "max_position_embeddings": s.max_position_embeddings,
        "llama_4_scaling": {"original_max_position_embeddings": s.original_max_position_embeddings,
                            "beta": s.llama_4_scaling_beta},
    }
    if s.quant == "fp8-per-tensor":
        p["quantization"] = {"qformat_weight": "fp8_e4m3", "qscheme_act": "TENSOR"}
    if s.rope == "yarn":
        p["yarn"] = {"original_max_position_embeddings": s.original_max_position_embeddings,
                     "factor": s.yarn_factor, "apply_scale": True, "beta": 32.0, "alpha": 1.0}
    return p
