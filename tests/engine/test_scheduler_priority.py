"""Priority scheduling (vLLM's --scheduling-policy priority): (priority, arrival) orders
admission, the waiting queue a preempted request returns to, and the choice of the
sequence preempted; FCFS keeps arrival order. Outputs never depend on the policy."""

import random

import pytest

from engine.kv.block_allocator import BlockAllocator
from engine.request import Request
from engine.scheduler import Scheduler
from tests.engine.fake_runner import CacheCheckingRunner, expected_tokens
from tests.engine.test_scheduler import advance, drive, make_req


def ranked(i: int, priority: int, prompt: list[int], max_tokens: int) -> Request:
    r = make_req(i, prompt, max_tokens)
    r.priority = priority
    return r


def ids(reqs) -> list[str]:
    return [r.request_id for r in reqs]


def test_admission_and_the_queue_follow_priority_then_arrival():
    sched = Scheduler(BlockAllocator(64, 4), max_num_seqs=2, max_num_batched_tokens=64,
                      policy="priority")
    for i, p in enumerate([3, 1, 2, 0, 1]):
        sched.add(ranked(i, p, [i + 1, 3], 3))
    out = sched.schedule()
    assert ids(out.requests) == ["r3", "r1"]
    assert ids(sched.waiting) == ["r4", "r2", "r0"]  # r4 ties r1's priority, came later


def test_fcfs_ignores_nothing_because_every_priority_is_zero():
    sched = Scheduler(BlockAllocator(64, 4), max_num_seqs=2, max_num_batched_tokens=64)
    assert not sched.by_priority
    for i in range(4):
        sched.add(make_req(i, [i + 1, 3], 3))
    assert ids(sched.schedule().requests) == ["r0", "r1"]


def staggered(num_blocks: int) -> tuple[Scheduler, CacheCheckingRunner, list[Request]]:
    """r0 (priority 5, 7 tokens) runs alone first; then r1 (priority 0, 8 tokens) and r2
    (priority 3, 7 tokens) come: the running list is in arrival order, not rank order."""
    sched = Scheduler(BlockAllocator(num_blocks, 4), max_num_seqs=3,
                      max_num_batched_tokens=64, policy="priority")
    runner = CacheCheckingRunner(num_blocks, 4)
    a, b, c = (ranked(i, p, [10 * i + k + 1 for k in range(n)], 6)
               for i, (p, n) in enumerate([(5, 7), (0, 8), (3, 7)]))
    sched.add(a)
    advance(sched, runner, sched.schedule())
    sched.add(b)
    sched.add(c)
    advance(sched, runner, sched.schedule())
    assert ids(sched.running) == ["r0", "r1", "r2"]
    return sched, runner, [a, b, c]


def test_decodes_run_in_priority_order():
    sched, _, _ = staggered(64)
    assert ids(sched.schedule().requests) == ["r1", "r2", "r0"]


def test_the_preempted_sequence_is_the_lowest_priority_and_requeues_at_its_rank():
    # 6 blocks of 4, all in use: r1's next token needs a third block
    sched, _, _ = staggered(6)
    sched.add(ranked(3, 4, [40, 41, 42, 43, 44, 45, 46], 6))  # waits: no free block
    out = sched.schedule()
    assert ids(out.preempted) == ["r0"]  # priority 5: not r2, the latest arrival
    assert ids(out.requests) == ["r1", "r2"]
    # r0 goes back to its rank's place: behind r3 (priority 4), not at the front
    assert ids(sched.waiting) == ["r3", "r0"]


def test_fcfs_preempts_the_latest_arrival_and_requeues_it_first():
    sched = Scheduler(BlockAllocator(6, 4), max_num_seqs=3, max_num_batched_tokens=64)
    runner = CacheCheckingRunner(6, 4)
    reqs = [make_req(i, [10 * i + k + 1 for k in range(8)], 4) for i in range(3)]
    for r in reqs:
        sched.add(r)
    advance(sched, runner, sched.schedule())
    sched.add(make_req(3, [40, 41, 42, 43, 44, 45, 46, 47], 4))
    out = sched.schedule()
    assert ids(out.preempted) == ["r2"]
    assert ids(out.requests) == ["r0", "r1"]
    assert ids(sched.waiting) == ["r2", "r3"]


def test_a_later_high_priority_request_finishes_first_with_one_slot():
    sched = Scheduler(BlockAllocator(64, 4), max_num_seqs=1, max_num_batched_tokens=64,
                      policy="priority")
    runner = CacheCheckingRunner(64, 4)
    reqs = [ranked(i, p, [i + 1, 2, 3], 3) for i, p in enumerate([2, 2, 0, 1])]
    log = drive(sched, runner, reqs, arrivals={0: reqs[:2], 1: reqs[2:]})
    last = {r.request_id: step for step, out in enumerate(log) for r in out.requests}
    # r0 was running when the others came (no preemption to admit); then by priority
    assert sorted(last, key=last.get) == ["r0", "r2", "r3", "r1"]
    for r in reqs:
        assert r.output_ids == expected_tokens(list(r.prompt_ids), 3)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_outputs_are_exact_under_priorities_and_kv_pressure(seed):
    rng = random.Random(seed)
    sched = Scheduler(BlockAllocator(10, 4), max_num_seqs=4, max_num_batched_tokens=12,
                      policy="priority")
    runner = CacheCheckingRunner(10, 4)
    arrivals: dict[int, list[Request]] = {}
    reqs = []
    for i in range(12):
        p = [rng.randrange(1, 50) for _ in range(rng.randrange(1, 16))]
        r = ranked(i, rng.randrange(-2, 3), p, rng.randrange(4, 16))
        reqs.append(r)
        arrivals.setdefault(rng.randrange(0, 8), []).append(r)
    drive(sched, runner, reqs, arrivals=arrivals)
    assert sum(r.num_preemptions for r in reqs) > 0  # the cache really ran out
    for r in reqs:
        assert r.output_ids == expected_tokens(list(r.prompt_ids), r.params.max_tokens)
    assert sched.allocator.num_free == 10


def test_an_unknown_policy_is_refused():
    with pytest.raises(ValueError, match="lottery"):
        Scheduler(BlockAllocator(8, 4), max_num_seqs=1, max_num_batched_tokens=8,
                  policy="lottery")
