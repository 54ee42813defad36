"""Prompt logprobs (params.prompt_logprobs, what echo + logprobs serves): one entry per
prompt token, entry 0 None, each scoring prompt[p] given prompt[:p]; the same however the
prompt is chunked, exactly once per position under preemption, sent with the first output
only; and on a real model equal to log_softmax of one-shot prefill logits."""

from __future__ import annotations

import math

import torch

from engine.batch import LogitsWanted
from engine.config import EngineConfig
from engine.engine import Engine
from engine.sampler import Sampler
from engine.sampling_params import SamplingParams
from tests.engine.fake_runner import (
    VOCAB,
    CacheCheckingRunner,
    FakeDetokenizer,
    FakeTokenizer,
    expected_tokens,
    next_token,
)
from tests.engine.test_engine import collect, make_engine, run_all
from tests.engine.test_model_support import make_runner, random_weights, tiny_config
from tests.engine.test_runner import _one_shot

GREEDY = dict(temperature=0.0, ignore_eos=True)
# the fake runner puts logit 10 on next_token(prefix) and -10 elsewhere
HIT = -math.log1p((VOCAB - 1) * math.exp(-20.0))
MISS = -20.0 + HIT


def prompt_with_hits(seed: int, n: int) -> list[int]:
    """Every third token is the fake model's prediction, the rest are not."""
    g = torch.Generator().manual_seed(seed)
    ids = [int(torch.randint(1, VOCAB, (1,), generator=g))]
    while len(ids) < n:
        pred = next_token(ids)
        ids.append(pred if len(ids) % 3 == 0 else (pred + 1 + len(ids)) % VOCAB or 1)
    return ids


def check_fake_logprobs(prompt: list[int], lps, k: int) -> None:
    assert len(lps) == len(prompt) and lps[0] is None
    for p in range(1, len(prompt)):
        lp = lps[p]
        pred = next_token(prompt[:p])
        assert lp.token_id == prompt[p]
        assert math.isclose(lp.logprob, HIT if prompt[p] == pred else MISS, abs_tol=1e-4)
        assert len(lp.top) == k and (k == 0 or lp.top[0][0] == pred)


def test_scored_once_per_position_over_chunks_first_output_only() -> None:
    prompt = prompt_with_hits(0, 23)
    runner = CacheCheckingRunner()
    eng = make_engine(runner, budget=5)  # 5 prefill chunks
    outs = collect(eng, "a", prompt, SamplingParams(max_tokens=4, prompt_logprobs=2, **GREEDY))
    run_all(eng)
    check_fake_logprobs(prompt, outs[0].prompt_logprobs, 2)
    assert all(o.prompt_logprobs is None for o in outs[1:])
    assert [o.token_ids[0] for o in outs] == expected_tokens(prompt, 4)
    wanted = [c.logits for b in runner.batches for c in b.chunks]
    assert wanted[:5] == [LogitsWanted.ALL] * 5 and LogitsWanted.ALL not in wanted[5:]


def test_not_asked_means_no_extra_rows() -> None:
    runner = CacheCheckingRunner()
    eng = make_engine(runner, budget=5)
    outs = collect(eng, "a", [3, 4, 5, 6, 7, 8, 9], SamplingParams(max_tokens=2, **GREEDY))
    run_all(eng)
    assert outs[0].prompt_logprobs is None
    assert all(c.logits is not LogitsWanted.ALL for b in runner.batches for c in b.chunks)


def test_preemption_recomputes_without_rescoring() -> None:
    prompts = [prompt_with_hits(s, 9 + 3 * s) for s in range(6)]
    runner = CacheCheckingRunner(num_kv_blocks=12, block_size=4)
    eng = make_engine(runner, budget=8)
    got = [collect(eng, f"r{i}", p, SamplingParams(max_tokens=10, prompt_logprobs=1,
                                                   **GREEDY))
           for i, p in enumerate(prompts)]
    run_all(eng)
    for p, outs in zip(prompts, got, strict=True):
        check_fake_logprobs(p, outs[0].prompt_logprobs, 1)
        assert [o.token_ids[0] for o in outs] == expected_tokens(p, 10)
    # the KV pressure above forces recomputation: some prompt ran more than once
    runs: dict[int, int] = {}
    for b in runner.batches:
        for c in b.chunks:
            if c.start_pos == 0:
                runs[c.seq_id] = runs.get(c.seq_id, 0) + 1
    assert max(runs.values()) > 1


def test_real_model_matches_one_shot_log_softmax() -> None:
    weights = random_weights(tiny_config(), seed=11)
    prompt = torch.randint(0, 320, (29,), generator=torch.Generator().manual_seed(3)).tolist()
    runner = make_runner(weights)
    cfg = EngineConfig(model_dir=".", max_num_seqs=2, max_model_len=64,
                       max_num_batched_tokens=6)
    eng = Engine(runner, FakeTokenizer(), cfg, detokenizer=FakeDetokenizer,
                 sampler=Sampler(()))
    outs = collect(eng, "a", prompt, SamplingParams(max_tokens=1, prompt_logprobs=3,
                                                    **GREEDY))
    run_all(eng)
    lps = outs[0].prompt_logprobs
    one_shot = torch.log_softmax(_one_shot(weights, prompt), dim=-1)
    assert lps[0] is None and len(lps) == len(prompt)
    for p in range(1, len(prompt)):
        ref = one_shot[p - 1]
        assert lps[p].token_id == prompt[p]
        tol = 2e-2 * float(ref.abs().max())  # chunked vs one-shot: tests/engine/test_runner.py
        assert abs(lps[p].logprob - float(ref[prompt[p]])) < tol
        top_ids = [t for t, _ in lps[p].top]
        assert len(top_ids) == 3 and abs(lps[p].top[0][1] - float(ref.max())) < tol
        assert all(abs(v - float(ref[t])) < tol for t, v in lps[p].top)

