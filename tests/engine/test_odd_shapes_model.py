"""Legal Ministral3 configs no published checkpoint has, on this host's kernels (the fused
C++ layers where they run; FP8SERVE_ISA=avx2 runs the AVX2 ones): hidden sizes that are
not multiples of 16 or 32 (72, 75, 200), head_dim unequal to hidden / heads (96, 256) or
not a multiple of 32 (80: attention on SDPA), one KV head or as many as query heads, odd
intermediate and vocab sizes, one layer, tied heads, 128 x 128 block scales over dims
they do not divide, a bf16 linear among FP8 ones.

Each model's logits over a 45-token prompt (past the 32-row GEMV/panel switch) match
transformers' fp32 Ministral3 (tolerance as in test_model_parity.py); every layer runs the
kernel its table puts first (no startup or runtime fallback: the C++ kernels take these
shapes); and the logits are bitwise the same chunked and batched, or, where attention
runs on SDPA, the kernel report says exactness is off and why.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from engine.batch import BatchInputs, LogitsWanted, SeqChunk
from engine.hardware_probe import probe_hardware
from engine.kernels.base import ScaleKind
from engine.kernels.reference import dequantize
from engine.kernels.registry import KernelOverrides
from engine.runner import ModelRunner
from tests.engine.test_model_parity import TOL
from tests.engine.test_model_support import (
    engine_config,
    hf_logits,
    hf_reference,
    logit_error,
    random_weights,
    tiny_config,
)

P = 45
PROMPT = torch.randint(0, 299, (P,), generator=torch.Generator().manual_seed(5)).tolist()
BF16_UP = "bf16_up_proj"

CASES: dict[str, tuple[dict[str, object], ScaleKind]] = {
    "h200_hd96_one_kv_head_one_layer": (dict(
        hidden_size=200, head_dim=96, num_heads=3, num_kv_heads=1, intermediate_size=1000,
        vocab_size=301, num_layers=1), ScaleKind.PER_TENSOR),
    "h72_hd256_tied_per_channel": (dict(
        hidden_size=72, head_dim=256, num_heads=2, num_kv_heads=1, intermediate_size=344,
        vocab_size=303, tied=True), ScaleKind.PER_CHANNEL),
    "h75_kv_heads_equal_heads": (dict(
        hidden_size=75, head_dim=64, num_heads=3, num_kv_heads=3, intermediate_size=127,
        vocab_size=299), ScaleKind.PER_TENSOR),
    "h200_blocks_over_ragged_dims": (dict(
        hidden_size=200, head_dim=128, num_heads=2, num_kv_heads=1, intermediate_size=344,
        vocab_size=301), ScaleKind.BLOCK),
    "h264_hd96_block_with_a_bf16_linear": (dict(
        hidden_size=264, head_dim=96, num_heads=4, num_kv_heads=2, intermediate_size=344,
        vocab_size=301, **{BF16_UP: True}), ScaleKind.BLOCK),
    "h72_hd80_sdpa": (dict(
        hidden_size=72, head_dim=80, num_heads=2, num_kv_heads=1, intermediate_size=200,
        vocab_size=301), ScaleKind.PER_TENSOR),
}


def _weights(case: str):
    kw, kind = CASES[case]
    kw = dict(kw)
    bf16_up = bool(kw.pop(BF16_UP, False))
    weights = random_weights(tiny_config(**kw), seed=3, kind=kind)
    if bf16_up:  # layer 0's up_proj unquantized (modules_to_not_convert)
        layers = list(weights.layers)
        layers[0] = replace(layers[0], up_proj=dequantize(layers[0].up_proj).to(torch.bfloat16))
        weights = replace(weights, layers=tuple(layers))
    return weights


def _run(runner: ModelRunner, *chunks: SeqChunk) -> torch.Tensor:
    return runner.run(BatchInputs(chunks))


@pytest.mark.parametrize("case", sorted(CASES))
def test_odd_shapes_match_transformers_on_their_first_choice_kernels(case: str) -> None:
    weights = _weights(case)
    runner = ModelRunner(weights, engine_config(max_model_len=64, kv_block_size=16),
                         probe_hardware(), KernelOverrides())
    whole = _run(runner, SeqChunk(0, tuple(PROMPT), 0, (0, 1, 2), LogitsWanted.ALL))
    ref = hf_logits(hf_reference(weights), PROMPT)
    assert whole.shape == ref.shape == (P, weights.config.vocab_size)
    err = logit_error(whole, ref)
    assert err < TOL, f"{case}: relative logit error {err:.4f}"
    assert (whole.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9

    report = runner.kernel_report
    moved = {c.layer: (c.first_choice, c.kernel_id) for c in report.choices.values()
             if c.kernel_id != c.first_choice}
    assert not moved and not report.fallbacks, (moved, report.fallbacks)

    chunked = torch.cat([_run(runner, SeqChunk(1, tuple(PROMPT[s:s + 7]), s, (3, 4, 5),
                                               LogitsWanted.ALL)) for s in range(0, P, 7)])
    batched = _run(runner, SeqChunk(2, tuple(PROMPT[::-1]), 0, (6, 7, 8), LogitsWanted.ALL),
                   SeqChunk(3, tuple(PROMPT), 0, (9, 10, 11), LogitsWanted.ALL))[P:]
    if weights.config.head_dim % 32:  # beyond the paged-attention op: SDPA, and said so
        attention = report.attention()
        assert attention is not None and attention["path"] == "sdpa"
        assert f"head_dim {weights.config.head_dim}" in str(attention["reason"])
        assert not report.batch_invariant()
        return
    assert report.batch_invariant()
    assert torch.equal(chunked, whole) and torch.equal(batched, whole)
