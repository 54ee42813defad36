"""fp8serve logits vs transformers' Ministral3 (fp32, holding the same dequantized weights)
for tiny random models built in memory: FP8 per-tensor / per-channel / block-scaled, bf16,
tied and untied, YaRN + Llama-4 scaling and llama-style plain RoPE.

Tolerance. Our activations, residual stream and logits are bf16 (8-bit mantissa, relative
rounding 2^-9 per op), the reference is fp32 throughout. We compare
``max |ours - ref| / max |ref|`` over every position of a 40-token prompt; positions 8..39
are past original_max_position_embeddings = 8, so YaRN and the Llama-4 query scale matter.
Measured here: ours ~0.022, transformers itself run in bf16 ~0.029 on the same weights;
every single RoPE mistake we tried (beta 0, factor 8 for 16, mscale_all_dim 0, original
16 for 8) gives >= 0.20. The bound 0.05 sits between the two with room on both sides, and
we also require ours to be no worse than 1.5x transformers' own bf16 error.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from engine.batch import BatchInputs, LogitsWanted, SeqChunk
from engine.config import RopeConfig
from engine.kernels.base import ScaleKind
from engine.kernels.reference import dequantize
from engine.weights import ModelWeights
from tests.engine.test_model_support import (
    hf_logits,
    hf_reference,
    logit_error,
    make_runner,
    random_weights,
    tiny_config,
    with_rope,
)

TOL = 0.05
PROMPT = torch.randint(0, 320, (40,), generator=torch.Generator().manual_seed(7)).tolist()
LLAMA_ROPE = RopeConfig(theta=10000.0)

CASES = {
    "fp8_per_tensor_untied": dict(),
    "fp8_per_tensor_tied": dict(tied=True),
    "fp8_per_channel": dict(kind=ScaleKind.PER_CHANNEL),
    "fp8_block": dict(kind=ScaleKind.BLOCK, hidden_size=256, intermediate_size=384,
                      num_heads=4, num_kv_heads=2, head_dim=64),
    "bf16": dict(quant="none"),
    "llama_style": dict(rope=LLAMA_ROPE, num_kv_heads=4, architecture="LlamaForCausalLM"),
    "gqa_4_to_1": dict(num_heads=4, num_kv_heads=1),
    "fp8_lm_head": dict(fp8_head=True),
    "unfused_qkv": dict(),
}


def _run_all(weights: object) -> torch.Tensor:
    runner = make_runner(weights)
    chunk = SeqChunk(0, tuple(PROMPT), 0, tuple(range(10, 20)), LogitsWanted.ALL)
    return runner.run(BatchInputs((chunk,)))


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers_fp32(case: str) -> None:
    kw = dict(CASES[case])
    kind = kw.pop("kind", ScaleKind.PER_TENSOR)
    fp8_head = bool(kw.pop("fp8_head", False))
    weights = random_weights(tiny_config(**kw), seed=3, kind=kind, fp8_head=fp8_head)
    if case == "unfused_qkv":  # a bf16 q_proj next to FP8 k/v: q/k/v cannot fuse
        weights = replace(weights, layers=tuple(
            replace(lw, q_proj=dequantize(lw.q_proj).to(torch.bfloat16))
            for lw in weights.layers))
    _check_parity(case, weights)


def _check_parity(case: str, weights: ModelWeights) -> None:
    ref_model = hf_reference(weights)
    ref = hf_logits(ref_model, PROMPT)
    ours = _run_all(weights)
    assert ours.shape == ref.shape == (40, 320) and ours.dtype == torch.float32
    err = logit_error(ours, ref)
    hf_bf16 = logit_error(hf_logits(ref_model.to(torch.bfloat16), PROMPT), ref)
    assert err < TOL, f"{case}: relative logit error {err:.4f}"
    assert err <= 1.5 * hf_bf16, f"{case}: ours {err:.4f} vs transformers bf16 {hf_bf16:.4f}"
    agree = (ours.argmax(-1) == ref.argmax(-1)).float().mean()
    assert agree >= 0.9


def test_fp8_lm_head_and_unfused_layers_are_reported() -> None:
    weights = random_weights(tiny_config(), fp8_head=True)
    weights = replace(weights, layers=tuple(
        replace(lw, q_proj=dequantize(lw.q_proj).to(torch.bfloat16)) for lw in weights.layers))
    choices = make_runner(weights).kernel_report.choices
    assert choices["lm_head"].scale_kind != "bf16"  # the FP8 head: an FP8 kernel
    assert "layers.0.self_attn.qkv_proj.k_proj" in choices
    # a bf16 linear: reported on its bf16 kernel
    assert choices["layers.0.self_attn.qkv_proj.q_proj"].scale_kind == "bf16"
    assert "layers.0.mlp.gate_up_proj" in choices


def test_fused_layers_are_reported_per_model() -> None:
    runner = make_runner(random_weights(tiny_config()))
    names = set(runner.kernel_report.choices)
    assert "layers.0.self_attn.qkv_proj" in names and "layers.1.mlp.gate_up_proj" in names
    assert "layers.0.self_attn.o_proj" in names and "layers.1.mlp.down_proj" in names
    qkv = runner.kernel_report.choices["layers.0.self_attn.qkv_proj"]
    assert qkv.scale_kind == "per_channel" and qkv.n == 4 * 32 + 2 * 2 * 32
    assert runner.kernel_report.choices["lm_head"].scale_kind == "bf16"  # on a bf16 kernel


@pytest.mark.parametrize("wrong", [
    dict(llama_4_scaling_beta=0.0), dict(factor=8.0), dict(original_max_position_embeddings=16),
])
def test_the_comparison_detects_rope_mistakes(wrong: dict[str, object]) -> None:
    """The tolerance is meaningful: one wrong RoPE parameter breaks it."""
    weights = random_weights(tiny_config(), seed=3)
    ref = hf_logits(hf_reference(weights), PROMPT)
    broken = replace(weights, config=with_rope(weights.config, **wrong))
    assert logit_error(_run_all(broken), ref) > 2 * TOL


def test_cpu_kernels_are_chosen_on_a_host_with_a_cuda_device() -> None:
    """Activations live in host memory: a CUDA-capable host must not get CUDA kernels."""
    from engine.hardware import HardwareInfo
    from engine.kernels.registry import KernelOverrides
    from engine.runner import ModelRunner
    from tests.engine.test_model_support import engine_config

    hw = HardwareInfo.fake(cuda_available=True, cuda_capability=(9, 0), cuda_name="H200")
    runner = ModelRunner(random_weights(tiny_config()), engine_config(), hw, KernelOverrides())
    assert {c.platform for c in runner.kernel_report.choices.values()} == {"cpu"}
    out = runner.run(BatchInputs((SeqChunk(0, (1, 2, 3), 0, (0,)),)))
    assert out.shape == (1, 320) and torch.isfinite(out).all()
