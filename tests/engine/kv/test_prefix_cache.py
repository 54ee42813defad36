"""The scheduler with a prefix cache, driven by a fake runner whose logits are computed
from what it reads back from its fake KV cache (tests/engine/fake_runner.py): a request
served from shared blocks that hold anything but its own tokens' K/V gets wrong tokens."""

import random
from types import SimpleNamespace

from engine.batch import LogitsWanted
from engine.kv.block_allocator import BlockAllocator
from engine.kv.prefix_cache import PrefixCache
from engine.request import Request, RequestStatus
from engine.scheduler import Scheduler
from tests.engine.fake_runner import CacheCheckingRunner, expected_tokens
from tests.engine.kv.test_block_allocator import check_invariants

BS = 4


def make(num_blocks: int = 64, seqs: int = 8, budget: int = 64, by_role: bool = False
         ) -> tuple[Scheduler, CacheCheckingRunner]:
    alloc = BlockAllocator(num_blocks, BS)
    cache = PrefixCache(alloc, by_role=by_role)
    return Scheduler(alloc, seqs, budget, prefix_cache=cache), CacheCheckingRunner(num_blocks, BS)


def req(name: str, prompt: list[int], max_tokens: int = 3, salt: str | None = None,
        prompt_logprobs: int | None = None) -> Request:
    r = Request(name, tuple(prompt), SimpleNamespace(max_tokens=max_tokens,
                                                     prompt_logprobs=prompt_logprobs), 0.0)
    r.seq_id, r.cache_salt = hash(name) % 10**6, salt
    return r


def run(sched: Scheduler, runner: CacheCheckingRunner, *reqs: Request,
        max_steps: int = 5000) -> list:
    """Add ``reqs`` and step until they finish; every output must be the expected one and
    the allocator's invariants hold at every step. Returns the scheduler outputs."""
    for r in reqs:
        sched.add(r)
    outs = []
    for _ in range(max_steps):
        out = sched.schedule()
        check_invariants(sched.allocator)
        if out is None:
            assert sched.num_unfinished == 0
            break
        outs.append(out)
        assert out.batch.num_tokens <= sched.max_num_batched_tokens
        logits = runner.run(out.batch)
        for r, chunk, (first, n) in zip(out.requests, out.batch.chunks, out.logit_spans(),
                                        strict=True):
            assert chunk.start_pos == r.num_computed
            r.num_computed += chunk.num_tokens
            if chunk.logits is LogitsWanted.ALL:
                r.prompt_logprobs += [None] * (chunk.num_tokens + (not r.prompt_logprobs))
                del r.prompt_logprobs[len(r.prompt_ids):]
            if n and r.num_uncomputed == 0:
                r.output_ids.append(int(logits[first + n - 1].argmax()))
                if len(r.output_ids) == r.params.max_tokens:
                    r.status = RequestStatus.FINISHED
                    sched.remove(r)
    else:
        raise AssertionError("did not finish")
    for r in reqs:
        assert r.output_ids == expected_tokens(list(r.prompt_ids), r.params.max_tokens), r
    return outs


def first_chunk(outs: list, r: Request):
    return next(c for o in outs for q, c in zip(o.requests, o.batch.chunks, strict=True)
                if q is r)


def test_full_hit_computes_only_the_last_block():
    sched, runner = make()
    prompt = list(range(1, 21))  # 20 tokens, 5 full blocks
    run(sched, runner, req("a", prompt))
    b = req("b", prompt)
    outs = run(sched, runner, b)
    assert b.num_cached_tokens == 16  # 4 blocks: the block of the last token is computed
    chunk = first_chunk(outs, b)
    assert chunk.start_pos == 16 and chunk.token_ids == tuple(prompt[16:])
    assert outs[0].cache_queries == 20 and outs[0].cache_hits == 16


def test_prompt_of_whole_blocks_recomputes_its_last_block():
    sched, runner = make()
    prompt = list(range(3, 19))  # exactly 4 blocks
    run(sched, runner, req("a", prompt))
    b = req("b", prompt)
    run(sched, runner, b)
    assert b.num_cached_tokens == 12


def test_partial_and_no_hits():
    sched, runner = make()
    base = list(range(5, 29))
    run(sched, runner, req("a", base))
    partial = req("partial", base[:10] + [40, 41, 42, 43, 44])
    miss = req("miss", [49] + base[1:])
    run(sched, runner, partial, miss)
    assert partial.num_cached_tokens == 8 and miss.num_cached_tokens == 0


def test_generated_tokens_are_shared_with_the_next_turn():
    sched, runner = make()
    prompt = list(range(1, 15))
    a = req("a", prompt, max_tokens=9)
    run(sched, runner, a)
    turn2 = req("turn2", prompt + a.output_ids + [7, 8, 9])
    run(sched, runner, turn2)
    computed_by_a = len(prompt) + len(a.output_ids) - 1  # its last sample never ran
    assert turn2.num_cached_tokens == computed_by_a // BS * BS > len(prompt) // BS * BS


def test_salts_and_prompt_logprobs_bypass_sharing():
    sched, runner = make()
    prompt = list(range(2, 30))
    run(sched, runner, req("a", prompt, salt="x"))
    other_salt, same_salt = req("b", prompt, salt="y"), req("c", prompt, salt="x")
    no_salt = req("d", prompt)
    scored = req("e", prompt, salt="x", prompt_logprobs=1)
    outs = run(sched, runner, other_salt, same_salt, no_salt, scored)
    assert (other_salt.num_cached_tokens, same_salt.num_cached_tokens) == (0, 24)
    assert no_salt.num_cached_tokens == 0
    assert scored.num_cached_tokens == 0 and first_chunk(outs, scored).start_pos == 0


def test_budget_and_blocks_count_only_what_is_computed():
    sched, runner = make(num_blocks=14, budget=8)
    prompt = list(range(1, 42))  # 41 tokens: 11 blocks
    run(sched, runner, req("a", prompt))
    b = req("b", prompt)
    outs = run(sched, runner, b)
    first = first_chunk(outs, b)
    assert first.start_pos == 40 and first.num_tokens == 1  # one step, 1 token computed
    # a second copy fits beside the first because the 10 shared blocks are not counted twice
    c, d = req("c", prompt, max_tokens=2), req("d", prompt, max_tokens=2)
    outs = run(sched, runner, c, d)
    assert {id(r) for r in outs[0].requests} == {id(c), id(d)}


def test_eviction_under_pressure_is_least_recently_used():
    sched, runner = make(num_blocks=16, budget=64)
    keep, drop = list(range(1, 17)), list(range(20, 36))  # 4 blocks each
    run(sched, runner, req("drop", drop, max_tokens=1))
    run(sched, runner, req("keep", keep, max_tokens=1))
    fill = [req(f"f{i}", [40 + i] + list(range(1, 8)), max_tokens=1) for i in range(3)]
    run(sched, runner, *fill)  # 6 of the 16 blocks: only never-used ones are taken
    again = req("keep2", keep, max_tokens=1)
    run(sched, runner, again)
    assert again.num_cached_tokens == 12
    big = req("big", [47] + list(range(1, 28)), max_tokens=1)  # 7 blocks: evicts "drop"
    run(sched, runner, big)
    late_keep, late_drop = req("k3", keep, max_tokens=1), req("d3", drop, max_tokens=1)
    run(sched, runner, late_keep)
    run(sched, runner, late_drop)
    assert late_keep.num_cached_tokens == 12 and late_drop.num_cached_tokens == 0
    assert sched.allocator.num_evicted > 0


def test_by_role_shares_a_block_only_in_the_roles_it_was_computed_in():
    """With rows by role (engine/kernels/amx.py) a position's K/V depends on whether it was
    a prompt or an output token: a block's key names how many of its positions are the
    prompt's, so the next turn does not read the previous answer's blocks, while requests
    that share a prompt prefix, or the same request recomputing its output, still share."""
    sched, runner = make(by_role=True)
    prompt = list(range(1, 15))  # 3 full blocks and 2 tokens
    a = req("a", prompt, max_tokens=9)
    run(sched, runner, a)
    turn2 = req("turn2", prompt + a.output_ids + [7, 8, 9])
    run(sched, runner, turn2)
    assert turn2.num_cached_tokens == len(prompt) // BS * BS  # a's answer is recomputed
    # turn2 committed its whole prompt, a's answer included (computed as prompt rows there)
    probe = req("probe", [*turn2.prompt_ids, 1, 2, 3, 4, 5])
    assert len(sched.prefix_cache.match(probe)) == len(turn2.prompt_ids) // BS
    # the same tokens as an output (a request recomputing after a preemption) take only
    # the blocks computed with the same roles: a's, not turn2's
    again = req("again", prompt, max_tokens=9)
    again.output_ids = list(a.output_ids)
    assert [sched.allocator.lookup(h) for h in sched.prefix_cache._hashes(again, 5)] == [
        sched.allocator.lookup(h) for h in sched.prefix_cache._hashes(a, 5)]
    assert sched.prefix_cache._hashes(again, 5)[3:] != sched.prefix_cache._hashes(turn2, 5)[3:]
    # keyed by tokens alone (a request keeps its hashes: fresh ones), they would be one
    roleless, as_output = PrefixCache(sched.allocator), req("y", prompt, max_tokens=9)
    as_output.output_ids = list(a.output_ids)
    assert roleless._hashes(req("x", prompt + a.output_ids), 5) == roleless._hashes(
        as_output, 5)


def test_preempted_requests_find_their_own_output_again_by_role():
    sched, runner = make(num_blocks=20, seqs=6, budget=32, by_role=True)
    shared = list(range(1, 25))
    reqs = [req(f"r{i}", shared + [30 + i], max_tokens=18) for i in range(6)]
    outs = run(sched, runner, *reqs)
    assert any(o.preempted for o in outs), "the test must preempt"
    # a recompute chunk of a preempted request that starts past the shared prompt blocks
    # (24 tokens) was served its own output blocks from the cache
    past_prompt = [c for o in outs for r, c in zip(o.requests, o.batch.chunks, strict=True)
                   if r.num_preemptions and c.num_tokens > 1 and c.start_pos > len(shared)]
    assert past_prompt, "a preempted request found its own output in the cache"


def test_preempted_requests_recompute_through_the_cache():
    sched, runner = make(num_blocks=20, seqs=6, budget=32)
    shared = list(range(1, 25))
    reqs = [req(f"r{i}", shared + [30 + i], max_tokens=18) for i in range(6)]
    outs = run(sched, runner, *reqs)
    assert any(o.preempted for o in outs), "the test must preempt"
    readmitted = [o for o in outs if o.preempted_cache_hits]
    assert readmitted, "a preempted request found its blocks in the cache"
    # first admissions alone make the exported queries (vLLM's): each prompt once
    assert sum(o.cache_queries for o in outs) == sum(len(r.prompt_ids) for r in reqs)


def test_reset_forgets_every_block():
    sched, runner = make()
    prompt = list(range(1, 21))
    run(sched, runner, req("a", prompt))
    assert sched.reset_prefix_cache() == 5
    b = req("b", prompt)
    run(sched, runner, b)
    assert b.num_cached_tokens == 0


def test_random_shared_prefix_workload_stays_exact():
    rng = random.Random(3)
    sched, runner = make(num_blocks=20, seqs=6, budget=24)
    prefixes = [[rng.randrange(1, 50) for _ in range(rng.randrange(4, 30))] for _ in range(4)]
    reqs = []
    for i in range(40):
        p = rng.choice(prefixes)[:rng.randrange(1, 30)] + [rng.randrange(1, 50)
                                                           for _ in range(rng.randrange(0, 9))]
        reqs.append(req(f"q{i}", p, max_tokens=rng.randrange(1, 14),
                        salt=rng.choice([None, None, "s"])))
    outs = run(sched, runner, *reqs)
    assert sum(o.cache_hits for o in outs) > 0 and any(o.preempted for o in outs)
