"""End to end from files: tiny random checkpoints written by engine.synth in every layout,
loaded by engine.loader into a ModelRunner, against transformers reading the same files
in fp32 (it dequantizes FP8 on CPU: W = W8 * weight_scale_inv, exact in fp32).

original_max_position_embeddings is 8 and the prompt 40 tokens, so YaRN and the Llama-4
query scale are exercised. Tolerance: max |ours - ref| / max |ref| < 0.05, the bound
justified in test_model_parity.py (bf16 activations; measured here 0.011-0.013).
Mistral-native files cannot be read by transformers; the native checkpoint is compared
with transformers on the Hugging Face checkpoint of the same seed (synth draws each
tensor from (seed, canonical name), so both hold the same model).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from engine.batch import BatchInputs, LogitsWanted, SeqChunk
from engine.hardware import HardwareInfo
from engine.kernels.registry import KernelOverrides
from engine.runner import ModelRunner, generate_greedy, load_runner
from engine.synth import SynthSpec, write_checkpoint
from tests.engine.test_model_support import engine_config, logit_error

TOL = 0.05
PROMPT = torch.randint(3, 1024, (40,), generator=torch.Generator().manual_seed(7)).tolist()

CASES: dict[str, dict[str, object]] = {
    "hf_text_fp8": dict(layout="hf-text"),
    "multimodal_language_model_prefix": dict(layout="hf-multimodal"),
    "multimodal_model_prefix_tied": dict(layout="hf-multimodal",
                                         mm_prefix="model.language_model.",
                                         tie_word_embeddings=True),
    "sharded_fp32_scales": dict(shard_bytes=200_000, scale_dtype="fp32"),
    "fp8_block": dict(quant="fp8-block"),
    "bf16": dict(quant="bf16"),
    "plain_rope_no_llama4": dict(rope="default", rope_theta=1e4, llama_4_scaling_beta=0.0),
}


def _spec(**kw: object) -> SynthSpec:
    return SynthSpec.preset("tiny", original_max_position_embeddings=8, seed=3, **kw)


def _runner(path: Path) -> ModelRunner:
    return load_runner(path, engine_config(kv_block_size=16), hw=HardwareInfo.fake(),
                       overrides=KernelOverrides())


def _ours(path: Path) -> torch.Tensor:
    chunk = SeqChunk(0, tuple(PROMPT), 0, (0, 1, 2), LogitsWanted.ALL)
    return _runner(path).run(BatchInputs((chunk,)))


def _reference(path: Path) -> torch.Tensor:
    import transformers

    cfg = json.loads((path / "config.json").read_text())
    cls = (transformers.Mistral3ForConditionalGeneration
           if cfg["architectures"][0] == "Mistral3ForConditionalGeneration"
           else transformers.AutoModelForCausalLM)
    model = cls.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([PROMPT])).logits[0].float()


def _check(ours: torch.Tensor, ref: torch.Tensor, what: str) -> None:
    assert ours.shape == ref.shape == (40, 1024)
    err = logit_error(ours, ref)
    assert err < TOL, f"{what}: relative logit error {err:.4f}"
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9


@pytest.mark.parametrize("case", sorted(CASES))
def test_checkpoint_logits_match_transformers(case: str, tmp_path: Path) -> None:
    write_checkpoint(tmp_path, _spec(**CASES[case]))
    _check(_ours(tmp_path), _reference(tmp_path), case)


def test_llama_architecture_config(tmp_path: Path) -> None:
    """A LlamaForCausalLM config (plain RoPE, no query scaling) over the same tensors."""
    write_checkpoint(tmp_path, _spec(rope="default", rope_theta=1e4, llama_4_scaling_beta=0.0))
    cfg_path = tmp_path / "config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg.update(architectures=["LlamaForCausalLM"], model_type="llama",
               rope_parameters={"rope_type": "default", "rope_theta": 1e4})
    cfg_path.write_text(json.dumps(cfg))
    runner = _runner(tmp_path)
    assert runner.config.rope.rope_type == "default"
    assert runner.config.rope.llama_4_scaling_beta == 0.0
    _check(_ours(tmp_path), _reference(tmp_path), "llama")


def test_native_checkpoint_matches_transformers_on_same_seed(tmp_path: Path) -> None:
    write_checkpoint(tmp_path / "native", _spec(layout="native"))
    write_checkpoint(tmp_path / "hf", _spec(layout="hf-text"))
    ours = _ours(tmp_path / "native")
    _check(ours, _reference(tmp_path / "hf"), "native")
    assert logit_error(ours, _ours(tmp_path / "hf")) < 1e-3  # same model, same kernels


def test_greedy_generation_from_checkpoint_with_cache_equals_recompute(tmp_path: Path) -> None:
    write_checkpoint(tmp_path, _spec())
    runner = _runner(tmp_path)
    fast = generate_greedy(runner, PROMPT[:20], max_new_tokens=8)
    slow: list[int] = []
    for _ in range(8):
        ids = tuple(PROMPT[:20] + slow)
        out = runner.run(BatchInputs((SeqChunk(1, ids, 0, (5, 6), LogitsWanted.LAST),)))
        slow.append(int(out[0].argmax()))
    assert fast == slow
