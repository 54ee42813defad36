"""GGUF (SmolLM2-135M-Instruct, Q4_1) -> Ministral-3 FP8 checkpoint, Hugging Face layout.

Output directory:
    config.json            Ministral3ForCausalLM, plain RoPE via rope_parameters,
                           quantization_config fp8 / static / per-tensor
    model.safetensors      model.embed_tokens.weight bf16 [V, H] (lm_head tied),
                           norms bf16 [H], per linear: weight fp8 e4m3 [N, K],
                           weight_scale_inv fp32 [], activation_scale fp32 []
    tokenizer.json, tokenizer_config.json, chat_template.jinja, generation_config.json
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import torch

from engine.demo_model.gguf_source import GgufModel, open_gguf
from engine.demo_model.quantize import activation_scale, dequantize_fp8, quantize_fp8
from engine.demo_model.reference_forward import DecoderShape, calibrate
from engine.demo_model.tokenizer_files import write_tokenizer_files

log = logging.getLogger(__name__)

LINEARS = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
           "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")

CALIBRATION_CHATS = (
    "What is the capital of France?",
    "Write a short poem about the sea.",
    "Explain in two sentences how a CPU executes a program.",
    "List three prime numbers greater than 100 and say why they are prime.",
    "Translate 'good morning, how are you?' into French and Spanish.",
)


def decoder_shape(meta: GgufModel) -> DecoderShape:
    return DecoderShape(meta.num_layers, meta.num_heads, meta.num_kv_heads, meta.head_dim,
                        meta.rope_theta, meta.rms_norm_eps)


def model_config(meta: GgufModel) -> dict:
    return {
        "architectures": ["Ministral3ForCausalLM"],
        "model_type": "ministral3",
        "hidden_size": meta.hidden_size,
        "intermediate_size": meta.intermediate_size,
        "num_hidden_layers": meta.num_layers,
        "num_attention_heads": meta.num_heads,
        "num_key_value_heads": meta.num_kv_heads,
        "head_dim": meta.head_dim,
        "vocab_size": meta.vocab_size,
        "max_position_embeddings": meta.context_length,
        "rms_norm_eps": meta.rms_norm_eps,
        "hidden_act": "silu",
        "tie_word_embeddings": True,
        "attention_dropout": 0.0,
        "sliding_window": None,
        "bos_token_id": meta.bos_token_id,
        "eos_token_id": meta.eos_token_id,
        "pad_token_id": meta.pad_token_id,
        "dtype": "bfloat16",
        "rope_parameters": {
            "rope_type": "default",
            "rope_theta": meta.rope_theta,
            "llama_4_scaling_beta": 0.0,
            "original_max_position_embeddings": meta.context_length,
        },
        "quantization_config": {
            "quant_method": "fp8",
            "activation_scheme": "static",
            "weight_block_size": None,
            "modules_to_not_convert": ["lm_head"],
        },
    }


def quantize_linears(tensors: dict[str, torch.Tensor], num_layers: int
                     ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """-> (tensors to save, fp32 tensors of the quantized model for calibration)."""
    saved: dict[str, torch.Tensor] = {}
    dequant: dict[str, torch.Tensor] = {}
    for name, w in tensors.items():
        dequant[name] = w.to(torch.bfloat16).to(torch.float32)
        saved[name] = w.to(torch.bfloat16).contiguous()
    for i in range(num_layers):
        for lin in LINEARS:
            key = f"model.layers.{i}.{lin}"
            w8, scale = quantize_fp8(tensors[f"{key}.weight"])
            saved[f"{key}.weight"], saved[f"{key}.weight_scale_inv"] = w8, scale
            dequant[f"{key}.weight"] = dequantize_fp8(w8, scale)
    return saved, dequant


def calibration_prompts(tokenizer_dir: Path) -> list[list[int]]:
    from engine.text.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(tokenizer_dir)
    return [tok.encode_chat([{"role": "user", "content": c}]) for c in CALIBRATION_CHATS]


def convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    """Write the converted checkpoint into ``out_dir`` (created; existing files replaced)."""
    from safetensors.torch import save_file

    out_dir.mkdir(parents=True, exist_ok=True)
    log.info("reading %s", gguf_path)
    meta, tensors = open_gguf(gguf_path)
    write_tokenizer_files(meta, out_dir)
    saved, dequant = quantize_linears(tensors, meta.num_layers)
    del tensors
    log.info("calibrating activation scales (fp32 forward of the quantized model)")
    amax = calibrate(dequant, decoder_shape(meta), calibration_prompts(out_dir))
    for i in range(meta.num_layers):
        for lin in LINEARS:
            key = f"model.layers.{i}.{lin}"
            saved[f"{key}.activation_scale"] = activation_scale(amax[key])
    save_file(saved, str(out_dir / "model.safetensors"), metadata={"format": "pt"})
    (out_dir / "config.json").write_text(json.dumps(model_config(meta), indent=2))
