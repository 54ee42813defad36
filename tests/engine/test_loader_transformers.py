"""Synthesized HF checkpoints load in transformers 5 (the independent reference), which
dequantizes FP8 on CPU to exactly the weights our loader + reference dequantizer give."""

from __future__ import annotations

import pytest
import torch
import transformers

from engine.kernels.base import Fp8Weight
from engine.kernels.reference import dequantize
from engine.loader import load_weights
from engine.weights import LINEAR_NAMES

CASES = [
    ("hf-text", {}),
    ("hf-text", {"quant": "fp8-block", "shard_bytes": 150_000, "tie_word_embeddings": True}),
    ("hf-multimodal", {}),
    ("hf-multimodal", {"mm_prefix": "model.language_model.", "scale_dtype": "fp32"}),
]


def _load_hf(model_dir, layout):
    cls = (transformers.AutoModelForCausalLM if layout == "hf-text"
           else transformers.Mistral3ForConditionalGeneration)
    model, info = cls.from_pretrained(model_dir, dtype=torch.float32, output_loading_info=True)
    return model, info


@pytest.mark.parametrize("layout,extra", CASES)
def test_transformers_loads_and_matches(tiny_checkpoint, layout, extra):
    d = tiny_checkpoint(layout=layout, **extra)
    model, info = _load_hf(d, layout)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not info.get("mismatched_keys"), info
    ours = load_weights(d, progress=False)
    sd = model.state_dict()
    prefix = "model." if layout == "hf-text" else "model.language_model."
    for i, layer in enumerate(ours.layers):
        for name in LINEAR_NAMES:
            attn = name in ("q_proj", "k_proj", "v_proj", "o_proj")
            module = ("self_attn." if attn else "mlp.") + name
            theirs = sd[f"{prefix}layers.{i}.{module}.weight"]
            w = getattr(layer, name)
            assert isinstance(w, Fp8Weight)
            assert torch.equal(theirs, dequantize(w)), f"layer {i} {name}"
        assert torch.equal(sd[f"{prefix}layers.{i}.input_layernorm.weight"],
                           layer.input_layernorm.float())
    assert torch.equal(sd[f"{prefix}embed_tokens.weight"], ours.embed_tokens.float())
    head = ours.embed_tokens if ours.lm_head is None else ours.lm_head
    assert torch.equal(sd["lm_head.weight"], head.float())
    rope = model.config.get_text_config().rope_parameters
    assert rope["llama_4_scaling_beta"] == pytest.approx(0.1)
    logits = model(torch.tensor([[1, 5, 7, 9, 11]])).logits
    assert logits.shape == (1, 5, 1024) and torch.isfinite(logits).all()
    assert 0.1 < logits.std().item() < 10.0  # sane activations


def test_transformers_loads_bf16(tiny_checkpoint):
    d = tiny_checkpoint(quant="bf16")
    model, info = _load_hf(d, "hf-text")
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ours = load_weights(d, progress=False)
    assert torch.equal(model.state_dict()["model.layers.0.mlp.up_proj.weight"],
                       ours.layers[0].up_proj.float())
