"""Long contexts on a tiny model whose original_max_position_embeddings is 32, so a prompt
of a few hundred tokens reaches far past it (YaRN, and a Llama-4 query scale up to
1 + 0.1 ln 9) and crosses the attention's 128-key segments (ext/csrc/attention.h).

On this host's kernels (the fused C++ layers and paged attention where the extension
runs): logits of every position against transformers' fp32 Ministral3 (tolerance as in
test_model_parity.py), and the same bits whether the prompt runs whole, in chunks that do
not divide 128, or one token at a time.
"""

from __future__ import annotations

import pytest
import torch

from engine.batch import BatchInputs, LogitsWanted, SeqChunk
from engine.hardware_probe import probe_hardware
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
    with_rope,
)

ORIGINAL = 32
N = 270  # past 2 * 128 keys and 8 * ORIGINAL positions
PROMPT = torch.randint(0, 320, (N,), generator=torch.Generator().manual_seed(11)).tolist()


@pytest.fixture(scope="module")
def model():
    weights = random_weights(with_rope(tiny_config(), original_max_position_embeddings=ORIGINAL),
                             seed=4)
    runner = ModelRunner(weights, engine_config(max_model_len=N + 2, kv_block_size=5),
                         probe_hardware(), KernelOverrides())
    return weights, runner


def _logits(runner: ModelRunner, chunk_len: int) -> torch.Tensor:
    blocks = tuple(range(-(-N // runner.block_size)))
    rows = [runner.run(BatchInputs((SeqChunk(0, tuple(PROMPT[s:s + chunk_len]), s, blocks,
                                             LogitsWanted.ALL),)))
            for s in range(0, N, chunk_len)]
    return torch.cat(rows)


def test_logits_past_the_original_context_match_transformers(model) -> None:
    weights, runner = model
    ours, ref = _logits(runner, N), hf_logits(hf_reference(weights), PROMPT)
    for lo, hi in ((0, ORIGINAL), (ORIGINAL, 128), (128, 256), (256, N)):
        err = logit_error(ours[lo:hi], ref[lo:hi])
        assert err < TOL, f"positions [{lo}, {hi}): relative logit error {err:.4f}"
    assert (ours.argmax(-1) == ref.argmax(-1)).float().mean() >= 0.9


@pytest.mark.parametrize("chunk_len", [37, 100, 1])
def test_chunked_and_token_by_token_give_the_whole_prompts_bits(model, chunk_len: int) -> None:
    _, runner = model
    assert torch.equal(_logits(runner, chunk_len), _logits(runner, N))
