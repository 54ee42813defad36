"""bench serve workloads (bench/serve/workloads.py, passes.plan): each turn's prompt
extends the previous turn's, the shared prefix is shared, the salts of the cached pass are
one per pass and those of the uncached pass one per request, and passes interleave."""

from __future__ import annotations

import pytest

from bench.serve.config import BenchConfig
from bench.serve.passes import plan
from bench.serve.workloads import (
    CACHED,
    UNCACHED,
    conversations,
    pass_salts,
    passes,
    shared_prefix_prompts,
    turn_prompt,
)


def test_each_turn_extends_the_previous_turn_by_its_reply_and_a_user_message() -> None:
    (system, users), = conversations(1, 4, system_len=50, input_len=8, lo=10, hi=99, seed=3)
    assert len(system) == 50 and [len(u) for u in users] == [8] * 4
    replies = [[1, 2, 3], [], [4]]
    prompts = [turn_prompt(system, users, replies[:k]) for k in range(4)]
    assert prompts[0] == system + users[0]
    for k in range(1, 4):
        assert prompts[k] == prompts[k - 1] + replies[k - 1] + users[k]
    assert [len(p) for p in prompts] == [58, 69, 77, 86]


def test_conversations_are_seeded_and_have_their_own_system_prompts() -> None:
    a = conversations(3, 2, system_len=20, input_len=4, lo=1000, hi=20000, seed=0)
    assert a == conversations(3, 2, system_len=20, input_len=4, lo=1000, hi=20000, seed=0)
    assert a != conversations(3, 2, system_len=20, input_len=4, lo=1000, hi=20000, seed=1)
    assert len({tuple(system) for system, _ in a}) == 3
    assert all(1000 <= t < 20000 for system, users in a for t in system + users[1])


def test_shared_prefix_prompts_share_the_system_prompt_only() -> None:
    prompts = shared_prefix_prompts(5, system_len=30, input_len=6, lo=1000, hi=20000, seed=0)
    assert [len(p) for p in prompts] == [36] * 5
    assert len({tuple(p[:30]) for p in prompts}) == 1
    assert len({tuple(p[30:]) for p in prompts}) == 5


def test_cached_pass_shares_one_fresh_salt_uncached_gives_each_request_its_own() -> None:
    cached = pass_salts(CACHED, 3, 4)
    assert [len(s) for s in cached] == [4] * 3
    assert len({s for conv in cached for s in conv}) == 1
    again = pass_salts(CACHED, 3, 4)
    assert again[0][0] != cached[0][0]  # an earlier pass's blocks never count
    uncached = pass_salts(UNCACHED, 3, 4)
    flat = [s for conv in uncached for s in conv]
    assert len(flat) == 12 and len(set(flat)) == 12  # per conversation and per turn
    assert not set(flat) & {cached[0][0], again[0][0]}
    with pytest.raises(ValueError, match="unknown pass"):
        pass_salts("warm", 1)


def test_plan_interleaves_passes_and_servers_and_swaps_them_every_other_round() -> None:
    base = BenchConfig("http://a", workload="multi-turn")
    steps = [(rnd, cfg.concurrency, cfg.url, mode)
             for rnd, cfg, mode in plan(base, 2, [1, 4], ["http://a", "http://b"])]
    assert steps[:4] == [(0, 1, "http://a", CACHED), (0, 1, "http://a", UNCACHED),
                         (0, 1, "http://b", CACHED), (0, 1, "http://b", UNCACHED)]
    assert steps[8:12] == [(1, 1, "http://b", UNCACHED), (1, 1, "http://b", CACHED),
                           (1, 1, "http://a", UNCACHED), (1, 1, "http://a", CACHED)]
    assert len(steps) == 16 and {s[1] for s in steps[4:8]} == {4}
    random_steps = plan(BenchConfig("http://a"), 2, [1], ["http://a"])
    assert [(r, m) for r, _, m in random_steps] == [(0, UNCACHED), (1, UNCACHED)]
    assert passes("random") == (UNCACHED,) and passes("shared-prefix") == (CACHED, UNCACHED)


def test_config_rejects_what_cannot_run() -> None:
    with pytest.raises(ValueError, match="workload must be one of"):
        BenchConfig("http://a", workload="chat")
    with pytest.raises(ValueError, match="turns must be >= 1"):
        BenchConfig("http://a", workload="multi-turn", turns=0)
    with pytest.raises(ValueError, match="num_prompts >= 2"):
        BenchConfig("http://a", workload="shared-prefix", num_prompts=1)


def test_random_prompts_differ_per_round_and_level_and_not_per_server() -> None:
    from bench.serve.run import random_prompts

    steps = plan(BenchConfig("http://a", num_prompts=3, input_len=5), 2, [1, 4],
                 ["http://a", "http://b"])
    by_pass: dict[tuple[int, int], list] = {}
    for rnd, cfg, _ in steps:
        by_pass.setdefault((rnd, cfg.concurrency), []).append(random_prompts(cfg))
    assert len(by_pass) == 4
    for same in by_pass.values():
        assert len(same) == 2 and same[0] == same[1]  # both servers get the same work
    prompts = [tuple(p) for same in by_pass.values() for p in same[0]]
    assert len(set(prompts)) == len(prompts) == 12  # no pass repeats another's
