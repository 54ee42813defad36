"""A host below AVX2 with the extension built (an x86-64-v2 virtual CPU, or
FP8SERVE_ISA=scalar): the decoder runs the Python layers on the portable FP8 kernels and
the bf16_portable head, and greedy answers stay exact: a sequence's logits inside a batch
of decodes, a batched prefill or a chunked prefill equal its logits alone, bit for bit.

On AVX2 and AVX-512 hosts the profile below is faked (no cpuid flags), so these tests
run the same kernels everywhere; attention runs at the host's dispatch level, as it would
on that host at its own."""

from __future__ import annotations

import pytest
import torch

from engine.batch import BatchInputs, LogitsWanted, SeqChunk
from engine.kernels.base import ScaleKind
from engine.kernels.registry import KernelOverrides
from engine.runner import ModelRunner
from tests.engine.test_model_support import engine_config, random_weights, tiny_config
from tests.ext.support import fake_hw

NONE, ALL = LogitsWanted.NONE, LogitsWanted.ALL


@pytest.fixture(scope="module", params=[ScaleKind.PER_TENSOR, ScaleKind.BLOCK],
                ids=["per-tensor", "block"])
def weights(request):
    return random_weights(tiny_config(num_layers=3), seed=21, kind=request.param, block=32)


def _runner(weights) -> ModelRunner:
    return ModelRunner(weights, engine_config(), fake_hw(), KernelOverrides())


def _ids(n: int, seed: int) -> list[int]:
    return torch.randint(0, 320, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def test_layers_and_head_run_the_portable_kernels(weights) -> None:
    runner = _runner(weights)
    kernels = {c.kernel_id for c in runner.kernel_report.choices.values()
               if c.layer.startswith("layers.")}
    assert kernels <= {"portable_w8a16", "portable_block_w8a16"} and len(kernels) == 1
    assert runner.model.lm_head.kernel_id == "bf16_portable"
    assert all(r is not None for r in runner.model.fusion_reasons)  # Python layers


def test_batched_decode_equals_solo_bitwise(weights) -> None:
    runner = _runner(weights)
    lens = [3, 17, 9, 30, 1, 12]
    tables = {s: tuple(range(8 * s, 8 * s + 8)) for s in range(len(lens))}
    for s, n in enumerate(lens):
        runner.run(BatchInputs((SeqChunk(s, tuple(_ids(n, 10 + s)), 0, tables[s]),)))
    step = [SeqChunk(s, (7,), n, tables[s]) for s, n in enumerate(lens)]
    batched = runner.run(BatchInputs(tuple(step)))
    for i, chunk in enumerate(step):
        assert torch.equal(runner.run(BatchInputs((chunk,)))[0], batched[i]), i


def test_batched_and_chunked_prefill_equal_solo_bitwise(weights) -> None:
    prompts = {s: _ids(n, 30 + s) for s, n in enumerate([5, 19, 1, 11])}
    tables = {s: tuple(range(6 * s, 6 * s + 6)) for s in prompts}
    chunks = tuple(SeqChunk(s, tuple(p), 0, tables[s], ALL) for s, p in prompts.items())
    together = _runner(weights).run(BatchInputs(chunks))
    row = 0
    for chunk in chunks:
        alone = _runner(weights).run(BatchInputs((chunk,)))
        assert torch.equal(alone, together[row:row + chunk.num_tokens]), chunk.seq_id
        row += chunk.num_tokens
    prompt, blocks = prompts[1], tables[1]
    chunked = _runner(weights)
    for a, b in ((0, 6), (6, 13), (13, 18)):
        chunked.run(BatchInputs((SeqChunk(1, tuple(prompt[a:b]), a, blocks, NONE),)))
    last = chunked.run(BatchInputs((SeqChunk(1, (prompt[18],), 18, blocks),)))
    assert torch.equal(last[0], together[5 + 18])
