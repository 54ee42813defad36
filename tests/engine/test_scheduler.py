"""Scheduler invariants, driven by a tiny loop that plays the engine's part and a fake
runner whose outputs depend on the KV cache contents (tests/engine/fake_runner.py)."""

import random
from types import SimpleNamespace

import pytest

from engine.batch import LogitsWanted
from engine.kv.block_allocator import BlockAllocator
from engine.request import Request, RequestStatus
from engine.scheduler import KvCapacityError, Scheduler
from tests.engine.fake_runner import CacheCheckingRunner, expected_tokens


def make_req(i: int, prompt: list[int], max_tokens: int) -> Request:
    r = Request(f"r{i}", tuple(prompt), SimpleNamespace(max_tokens=max_tokens), 0.0)
    r.seq_id = i
    return r


def drive(sched: Scheduler, runner: CacheCheckingRunner, reqs: list[Request], *,
          max_steps: int = 10_000, arrivals: dict[int, list[Request]] | None = None):
    """Run until all requests produced max_tokens; check invariants every step."""
    arrivals = arrivals or {0: reqs}
    log = []
    for step in range(max_steps):
        for r in arrivals.get(step, []):
            sched.add(r)
        out = sched.schedule()
        if out is None:
            if sched.num_unfinished == 0 and step > max(arrivals):
                return log
            continue
        batch = out.batch
        assert batch.num_tokens <= sched.max_num_batched_tokens
        assert len(sched.running) <= sched.max_num_seqs
        assert 0.0 <= sched.allocator.usage <= 1.0
        used = sum(len(r.block_table) for r in sched.running)
        assert used == round(sched.allocator.usage * sched.allocator.num_blocks)
        log.append(out)
        advance(sched, runner, out)
        # a prompt is left mid-prefill only when the budget ran out on it, so the next
        # step continues it before admitting another (priority scheduling relies on it)
        assert sum(0 < r.num_computed < len(r.prompt_ids) for r in sched.running) <= 1
    raise AssertionError("did not finish")


def advance(sched: Scheduler, runner: CacheCheckingRunner, out) -> None:
    """Play the engine's part for one scheduled step: run it, append each sampled token
    and drop the requests that reached max_tokens."""
    logits = runner.run(out.batch)
    spans = out.logit_spans()
    for req, chunk, (first, n) in zip(out.requests, out.batch.chunks, spans, strict=True):
        assert chunk.start_pos == req.num_computed
        req.num_computed += chunk.num_tokens
        if n:
            req.output_ids.append(int(logits[first + n - 1].argmax()))
            if len(req.output_ids) == req.params.max_tokens:
                req.status = RequestStatus.FINISHED
                sched.remove(req)


def test_decodes_are_never_stalled_by_a_long_prompt():
    sched = Scheduler(BlockAllocator(64, 4), max_num_seqs=4, max_num_batched_tokens=8)
    runner = CacheCheckingRunner(64, 4)
    short = make_req(0, [1, 2], 12)
    long = make_req(1, list(range(1, 41)), 2)
    log = drive(sched, runner, [short, long], arrivals={0: [short], 2: [long]})
    # every step while the long prompt was prefilling also decoded the short request
    prefill_steps = [o for o in log
                     if any(r is long and c.logits is LogitsWanted.NONE
                            for r, c in zip(o.requests, o.batch.chunks, strict=True))]
    assert len(prefill_steps) >= 4  # 40 tokens under an 8-token budget: chunked
    for o in prefill_steps:
        assert short in o.requests
    assert short.output_ids == expected_tokens([1, 2], 12)
    assert long.output_ids == expected_tokens(list(range(1, 41)), 2)


def test_max_num_seqs_bounds_running_and_fifo_admission():
    sched = Scheduler(BlockAllocator(64, 4), max_num_seqs=2, max_num_batched_tokens=64)
    reqs = [make_req(i, [i + 1, 3], 3) for i in range(5)]
    for r in reqs:
        sched.add(r)
    out = sched.schedule()
    assert [r.request_id for r in out.requests] == ["r0", "r1"]
    assert [r.request_id for r in sched.waiting] == ["r2", "r3", "r4"]


def test_preemption_by_recompute_keeps_outputs_exact():
    # 10 blocks of 4 tokens = 40 slots; 6 requests needing up to 20 tokens each
    sched = Scheduler(BlockAllocator(10, 4), max_num_seqs=6, max_num_batched_tokens=32)
    runner = CacheCheckingRunner(10, 4)
    rng = random.Random(0)
    prompts = [[rng.randrange(1, 50) for _ in range(rng.randrange(3, 9))] for _ in range(6)]
    reqs = [make_req(i, p, 12) for i, p in enumerate(prompts)]
    drive(sched, runner, reqs)
    assert sum(r.num_preemptions for r in reqs) > 0  # the cache really ran out
    for r, p in zip(reqs, prompts, strict=True):
        assert r.output_ids == expected_tokens(p, 12)
    assert sched.allocator.usage == 0.0


def test_random_workload_invariants():
    rng = random.Random(1)
    sched = Scheduler(BlockAllocator(24, 4), max_num_seqs=3, max_num_batched_tokens=10)
    runner = CacheCheckingRunner(24, 4)
    arrivals: dict[int, list[Request]] = {}
    reqs = []
    for i in range(12):
        p = [rng.randrange(1, 50) for _ in range(rng.randrange(1, 30))]
        r = make_req(i, p, rng.randrange(1, 15))
        reqs.append(r)
        arrivals.setdefault(rng.randrange(0, 40), []).append(r)
    drive(sched, runner, reqs, arrivals=arrivals)
    for r in reqs:
        assert r.output_ids == expected_tokens(list(r.prompt_ids), r.params.max_tokens)
    assert sched.allocator.num_free == 24


def test_request_that_can_never_fit_is_refused():
    sched = Scheduler(BlockAllocator(4, 4), max_num_seqs=2, max_num_batched_tokens=8)
    sched.check_fits(10, 6)  # 16 tokens = exactly the cache
    with pytest.raises(KvCapacityError, match="KV cache capacity of 16 tokens"):
        sched.check_fits(10, 7)


def test_remove_frees_blocks_of_waiting_and_running():
    sched = Scheduler(BlockAllocator(8, 4), max_num_seqs=1, max_num_batched_tokens=64)
    a, b = make_req(0, [1] * 9, 2), make_req(1, [2] * 3, 2)
    sched.add(a)
    sched.add(b)
    sched.schedule()
    assert sched.allocator.num_free == 5 and sched.running == [a]
    sched.remove(a)
    sched.remove(b)
    assert sched.allocator.num_free == 8 and sched.num_unfinished == 0


def test_token_slice_equals_all_ids_slice():
    from engine.request import Request

    r = Request("t", (1, 2, 3), None, 0.0)
    r.output_ids = [4, 5, 6]
    for a in range(7):
        for b in range(a, 8):
            assert r.token_slice(a, b) == tuple(r.all_ids[a:b]), (a, b)


def _running_decoders(sched: Scheduler, n: int) -> list[Request]:
    """n requests whose one-token prompts are computed: each decodes next step."""
    reqs = [make_req(i, [1], 50) for i in range(n)]
    for r in reqs:
        sched.add(r)
    out = sched.schedule()
    assert out is not None and out.batch.num_tokens == n
    for r in reqs:
        r.num_computed += 1
        r.output_ids.append(5)
    return reqs


def test_prefill_cap_applies_only_to_steps_that_carry_decodes():
    sched = Scheduler(BlockAllocator(256, 4), max_num_seqs=8, max_num_batched_tokens=64,
                      max_prefill_tokens_with_decodes=10)
    decoders = _running_decoders(sched, 3)
    prompt = make_req(9, list(range(1, 101)), 4)
    sched.add(prompt)
    out = sched.schedule()
    assert [c.num_tokens for c in out.batch.chunks] == [1, 1, 1, 10]
    assert out.requests[:3] == tuple(decoders) and out.requests[3] is prompt
    assert out.num_decodes == 3
    prompt.num_computed += 10
    for r in decoders:  # the streams end: the next step carries no decode
        r.num_computed += 1
        sched.remove(r)
    out = sched.schedule()
    assert [c.num_tokens for c in out.batch.chunks] == [64]


def test_without_a_cap_prefill_takes_the_rest_of_the_budget():
    sched = Scheduler(BlockAllocator(256, 4), max_num_seqs=8, max_num_batched_tokens=64)
    _running_decoders(sched, 3)
    sched.add(make_req(9, list(range(1, 101)), 4))
    out = sched.schedule()
    assert [c.num_tokens for c in out.batch.chunks] == [1, 1, 1, 61]


def test_prefill_cap_keeps_outputs_exact_on_a_random_workload():
    rng = random.Random(7)
    sched = Scheduler(BlockAllocator(48, 4), max_num_seqs=4, max_num_batched_tokens=16,
                      max_prefill_tokens_with_decodes=3)
    runner = CacheCheckingRunner(48, 4)
    reqs = [make_req(i, [rng.randrange(1, 50) for _ in range(rng.randrange(1, 30))],
                     rng.randrange(1, 12)) for i in range(12)]
    arrivals: dict[int, list[Request]] = {}
    for r in reqs:
        arrivals.setdefault(rng.randrange(0, 40), []).append(r)
    log = drive(sched, runner, reqs, arrivals=arrivals)
    for r in reqs:
        assert r.output_ids == expected_tokens(r.prompt_ids, r.params.max_tokens), r.request_id
    capped = 0
    for out in log:
        n_dec = out.num_decodes
        assert all(c.num_tokens == 1 for c in out.batch.chunks[:n_dec])
        if n_dec:
            assert out.batch.num_tokens - n_dec <= 3
            capped += out.batch.num_tokens - n_dec == 3
    assert capped > 0  # the cap was reached in some steps
