"""Speculative decoding in the engine loop, with the real sampler and the fake runner that
reads every token back from its fake KV cache (tests/engine/fake_runner.py): outputs equal
plain decoding's, KV blocks are rolled back and never leak, preemption and abort mid-draft.
"""

import math
import random
from collections import Counter

from engine.config import EngineConfig
from engine.engine import Engine
from engine.request import FinishReason
from engine.sampling_params import SamplingParams
from engine.spec.config import SpeculativeConfig
from engine.spec.decoder import DraftLimits
from engine.stream import EngineObserver
from tests.engine.fake_runner import VOCAB, CacheCheckingRunner, FakeDetokenizer, FakeTokenizer

SPEC = SpeculativeConfig("ngram", 4, 3, 1)


def periodic(seq):
    """A "model" that repeats its context with period 5, except at every 13th position,
    where it writes something new: drafts are often right, sometimes wrong mid-way."""
    if len(seq) % 13 == 0:
        return (seq[-1] * 7 + 3) % VOCAB
    return seq[-5] if len(seq) >= 5 else (seq[-1] + 1) % VOCAB


class SpecCounter(EngineObserver):
    def __init__(self):
        self.drafted = self.accepted = self.drafts = self.preempted = 0
        self.tokens = 0

    def on_spec_decode(self, num_draft_tokens, num_accepted_tokens, grammar="none"):
        self.drafts += 1
        self.drafted += num_draft_tokens
        self.accepted += num_accepted_tokens

    def on_preempted(self, n):
        self.preempted += n

    def on_first_token(self, ttft):
        self.tokens += 1

    def on_token(self, itl, num_tokens=1):
        self.tokens += num_tokens


def make(spec, runner=None, observer=None, **kw):
    cfg = EngineConfig(model_dir=".", max_num_seqs=kw.pop("max_num_seqs", 4),
                       max_model_len=kw.pop("max_model_len", 96),
                       max_num_batched_tokens=kw.pop("budget", 32),
                       speculative_config=spec)
    runner = runner or CacheCheckingRunner(num_kv_blocks=kw.pop("blocks", 64),
                                           block_size=4, next_fn=periodic)
    eng = Engine(runner, FakeTokenizer(), cfg, detokenizer=FakeDetokenizer,
                 observer=observer, **kw)
    if eng.spec is not None:  # the fake runner's step times say nothing: drafting is free
        eng.spec.cost = FixedShare(0.0)
    return eng


class FixedShare:
    """engine.spec.cost.StepCost with a fixed row share (no fitting)."""

    def __init__(self, share):
        self.share = share

    def observe(self, rows, seconds):
        pass

    def row_share(self, num_seqs):
        return self.share


def run(engine, requests, max_steps=5000, on_step=None):
    outs = {rid: [] for rid, _, _ in requests}
    for rid, prompt, params in requests:
        engine.add_request(rid, prompt, params, outs[rid].append)
    for i in range(max_steps):
        if on_step is not None:
            on_step(i, engine)
        engine.step()
        if not engine._live and engine.stats().num_waiting == 0:
            return outs
    raise AssertionError("engine did not finish")


def flat(outs):
    """What a client sees: tokens, text, logprobs, how it ended."""
    return ([t for o in outs for t in o.token_ids], "".join(o.text for o in outs),
            [(lp.token_id, round(lp.logprob, 6), lp.top) for o in outs for lp in o.logprobs],
            outs[-1].finish_reason, outs[-1].stop_reason, outs[-1].num_output_tokens,
            [(lp.token_id, round(lp.logprob, 6), lp.top) if lp else None
             for o in outs for lp in (o.prompt_logprobs or ())])


def prompts(n, seed=0):
    rng = random.Random(seed)
    return [[rng.randrange(1, VOCAB) for _ in range(rng.randrange(3, 12))] for _ in range(n)]


def test_greedy_equals_plain_and_takes_fewer_steps():
    reqs = [(f"r{i}", p, SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
            for i, p in enumerate(prompts(6))]
    plain_runner = CacheCheckingRunner(block_size=4, next_fn=periodic)
    plain = run(make(None, plain_runner), reqs)
    counter = SpecCounter()
    spec_runner = CacheCheckingRunner(block_size=4, next_fn=periodic)
    eng = make(SPEC, spec_runner, counter)
    spec = run(eng, reqs)
    for rid in plain:
        assert flat(spec[rid]) == flat(plain[rid]), rid
    assert counter.accepted > 0 and counter.drafted > counter.accepted  # some rejected
    assert len(spec_runner.batches) < len(plain_runner.batches)
    assert counter.tokens == 6 * 40  # every token counted once
    st = eng.spec.stats
    assert (st.num_drafts, st.num_draft_tokens, st.num_accepted_tokens) == (
        counter.drafts, counter.drafted, counter.accepted)
    assert sum(st.accepted_per_pos) == st.num_accepted_tokens
    assert st.accepted_per_pos == sorted(st.accepted_per_pos, reverse=True)
    assert eng.stats().kv_cache_usage == 0.0
    # a step's accepted tokens leave as one output
    assert any(len(o.token_ids) > 1 for outs in spec.values() for o in outs)


def test_verify_chunks_carry_the_drafts_and_want_every_row():
    runner = CacheCheckingRunner(block_size=4, next_fn=periodic)
    run(make(SPEC, runner), [("a", [3, 1, 4, 1, 5, 9, 2, 6],
                              SamplingParams(max_tokens=20, temperature=0.0))])
    spec_chunks = [c for b in runner.batches for c in b.chunks if c.num_draft]
    assert spec_chunks
    for c in spec_chunks:
        assert 1 <= c.num_draft <= SPEC.num_speculative_tokens
        assert c.num_tokens == 1 + c.num_draft and c.logits.value == "all"


def test_stops_penalties_logprobs_and_min_tokens_as_plain():
    base = [7, 3, 9, 4, 11, 7, 3, 9]
    seq = []
    for _ in range(30):  # the greedy continuation, to place stops inside a drafted run
        seq.append(periodic(base + seq))
    cases = [
        SamplingParams(max_tokens=30, temperature=0.0, stop_token_ids=[seq[9]]),
        SamplingParams(max_tokens=30, temperature=0.0, stop=[f" {seq[7]} {seq[8]}"]),
        SamplingParams(max_tokens=30, temperature=0.0, stop=[f" {seq[7]}"],
                       include_stop_str_in_output=True),
        SamplingParams(max_tokens=30, temperature=0.0, repetition_penalty=1.3,
                       frequency_penalty=0.4, presence_penalty=0.2),
        SamplingParams(max_tokens=30, temperature=0.0, logprobs=3, min_tokens=12,
                       stop_token_ids=[seq[3]]),
        SamplingParams(max_tokens=30, temperature=0.0, logit_bias={seq[5]: -30.0}),
        SamplingParams(max_tokens=7, temperature=0.0),
        SamplingParams(max_tokens=20, temperature=0.0, prompt_logprobs=2, logprobs=1),
    ]
    reqs = [(f"c{i}", base, p) for i, p in enumerate(cases)]
    plain = run(make(None), reqs)
    counter = SpecCounter()
    spec = run(make(SPEC, observer=counter), reqs)
    for rid in plain:
        assert flat(spec[rid]) == flat(plain[rid]), rid
    assert counter.accepted > 0
    assert spec["c0"][-1].finish_reason is FinishReason.STOP
    assert spec["c6"][-1].num_output_tokens == 7
    assert len(flat(spec["c7"])[-1]) == len(base)  # prompt logprobs, entry 0 None


def test_max_model_len_and_max_tokens_bound_the_drafts():
    runner = CacheCheckingRunner(block_size=4, next_fn=periodic)
    eng = make(SPEC, runner, max_model_len=24)
    prompt = [5, 6, 7, 8, 9, 5, 6, 7, 8, 9]
    outs = run(eng, [("a", prompt, SamplingParams(max_tokens=14, temperature=0.0)),
                     ("b", prompt, SamplingParams(max_tokens=5, temperature=0.0))])
    assert outs["a"][-1].num_output_tokens == 14 and outs["b"][-1].num_output_tokens == 5
    for b in runner.batches:
        for c in b.chunks:
            assert c.start_pos + c.num_tokens <= 24  # no position past max_model_len


def test_rollback_releases_blocks_across_a_block_boundary():
    """A draft that runs into a fresh block and is rejected gives that block back at the
    next schedule, and the kept tokens' K/V is what later steps read."""

    def wrong_after_8(seq):  # repeats period 4, then breaks the pattern at length 14
        return 1 if len(seq) == 14 else seq[-4]

    runner = CacheCheckingRunner(num_kv_blocks=32, block_size=4, next_fn=wrong_after_8)
    eng = make(SpeculativeConfig("ngram", 5, 2, 2), runner)
    prompt = [2, 3, 4, 5, 2, 3, 4, 5]  # 8 tokens = two full blocks
    seen = []

    def watch(i, engine):
        for req in engine.scheduler.running:
            seen.append((req.num_tokens, len(req.block_table)))

    outs = run(eng, [("a", prompt, SamplingParams(max_tokens=12, temperature=0.0))],
               on_step=watch)
    want, seq = [], list(prompt)
    for _ in range(12):
        want.append(wrong_after_8(seq))
        seq.append(want[-1])
    assert flat(outs["a"])[0] == want
    # some step held blocks past its tokens' need (the draft's tail) ...
    drafted = [c for b in runner.batches for c in b.chunks if c.num_draft]
    assert any(-(-(c.start_pos + c.num_tokens) // 4) > -(-(c.start_pos + 2) // 4)
               for c in drafted)
    # ... and before every schedule, a sequence never holds more than its tokens need
    # (watch runs before step(), i.e. after the previous verification's rollback ran at
    # the start of the last schedule, or before it: allow the one step in between)
    assert eng.stats().kv_cache_usage == 0.0
    assert eng.scheduler.allocator.num_free == 32


def test_scheduler_shrinks_the_rejected_tail_before_allocating():
    runner = CacheCheckingRunner(num_kv_blocks=32, block_size=4, next_fn=lambda s: 1
                                 if len(s) == 10 else s[-4])
    eng = make(SpeculativeConfig("ngram", 6, 2, 2), runner)
    eng.add_request("a", [2, 3, 4, 5, 2, 3, 4, 5], SamplingParams(max_tokens=10,
                                                                     temperature=0.0),
                    lambda o: None)
    sched, alloc = eng.scheduler, eng.scheduler.allocator
    shrunk = 0
    for _ in range(30):
        eng._take_inbox()
        for req in sched.running:  # what verification left: maybe a rejected tail
            before = len(req.block_table)
            need = alloc.blocks_for(req.num_tokens)
            shrunk += before > need
        out = sched.schedule()
        for req in sched.running:  # the shrink ran first: nothing past this step's chunk
            chunk = next(c for r, c in zip(out.requests, out.batch.chunks, strict=True)
                         if r is req)
            assert len(req.block_table) == alloc.blocks_for(chunk.start_pos
                                                            + chunk.num_tokens)
        for req in eng.steps.run(out, eng._live):
            eng._finish(req)
        if not eng._live:
            break
    assert shrunk > 0  # a rejected draft had written into a block it then gave back
    assert alloc.num_free == 32


def test_preemption_and_abort_mid_speculation():
    reqs = [(f"r{i}", p, SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))
            for i, p in enumerate(prompts(8, seed=5))]
    plain = run(make(None, blocks=20, max_num_seqs=8), reqs)
    counter = SpecCounter()
    runner = CacheCheckingRunner(num_kv_blocks=20, block_size=4, next_fn=periodic)
    eng = make(SPEC, runner, counter, max_num_seqs=8)

    def abort_r3(i, engine):
        if i == 12:
            engine.abort("r3")

    spec = run(eng, reqs, on_step=abort_r3)
    assert counter.preempted > 0 and counter.accepted > 0
    assert spec["r3"][-1].finish_reason is FinishReason.ABORT
    got = flat(spec["r3"])[0]
    assert got == flat(plain["r3"])[0][:len(got)]
    for rid in plain:
        if rid != "r3":
            assert flat(spec[rid]) == flat(plain[rid]), rid
    assert eng.scheduler.allocator.num_free == 20
    assert not eng.spec.proposer._index and not eng.spec._policy  # state released


def test_seeded_sampling_is_the_same_with_speculation_on_or_off():
    reqs = [(f"s{i}", p, SamplingParams(max_tokens=25, temperature=0.8, top_p=0.95,
                                        seed=100 + i, logprobs=2))
            for i, p in enumerate(prompts(6, seed=9))]

    def soft_runner():
        return CacheCheckingRunner(block_size=4, next_fn=periodic, soft=4.5)

    plain = run(make(None, soft_runner()), reqs)
    counter = SpecCounter()
    spec = run(make(SPEC, soft_runner(), counter), reqs)
    again = run(make(SPEC, soft_runner()), reqs)
    for rid in plain:
        assert flat(spec[rid]) == flat(plain[rid]) == flat(again[rid]), rid
    assert counter.accepted > 0 and counter.drafted > counter.accepted


def chi2_critical(dof, z=3.0902):
    """Wilson-Hilferty: the chi-square quantile at 1 - alpha, z the normal quantile
    (3.09 = alpha 0.001)."""
    return dof * (1 - 2 / (9 * dof) + z * math.sqrt(2 / (9 * dof))) ** 3


def two_sample_chi2(a: Counter, b: Counter, min_count=10):
    keys = [k for k in set(a) | set(b) if a[k] + b[k] >= min_count]
    other_a = sum(a.values()) - sum(a[k] for k in keys)
    other_b = sum(b.values()) - sum(b[k] for k in keys)
    cells = [(a[k], b[k]) for k in keys] + ([(other_a, other_b)] if other_a + other_b else [])
    na, nb = sum(a.values()), sum(b.values())
    stat = sum((x * math.sqrt(nb / na) - y * math.sqrt(na / nb)) ** 2 / (x + y)
               for x, y in cells if x + y)
    return stat, len(cells) - 1


def test_sampled_token_frequencies_match_plain_sampling():
    """Independent seeds for the two runs: position 6's token distribution with
    speculation matches plain sampling's (two-sample chi-square, alpha = 0.001); a rule
    that kept every draft would fail it (checked on the same data below)."""
    n = 500
    prompt = [4, 8, 15, 16, 23, 4, 8, 15, 16, 23]
    pos = 4

    def draw(spec, seed0):
        reqs = [(f"q{i}", prompt, SamplingParams(max_tokens=pos + 1, temperature=1.0,
                                                 seed=seed0 + i, ignore_eos=True))
                for i in range(n)]
        outs = run(make(spec, CacheCheckingRunner(num_kv_blocks=256, block_size=4,
                                                  next_fn=periodic, soft=4.5),
                        max_num_seqs=16, budget=128), reqs)
        return Counter(flat(o)[0][pos] for o in outs.values())

    plain, spec = draw(None, 0), draw(SPEC, 10_000)
    stat, dof = two_sample_chi2(plain, spec)
    assert dof >= 1 and stat < chi2_critical(dof), (stat, dof, plain, spec)
    # the test has power: moving half of the other tokens' mass onto the most likely
    # one (what a rule that kept drafts too often would do) is detected
    top = plain.most_common(1)[0][0]
    skewed = Counter({k: v - v // 2 for k, v in spec.items() if k != top})
    skewed[top] = n - sum(skewed.values())
    assert two_sample_chi2(plain, skewed)[0] > chi2_critical(dof)


def test_disable_by_batch_size():
    spec = SpeculativeConfig("ngram", 3, 2, 1, disable_by_batch_size=2)
    runner = CacheCheckingRunner(block_size=4, next_fn=periodic)
    reqs = [(f"r{i}", [5, 6, 7, 8, 9] * 2, SamplingParams(max_tokens=8 + 8 * i,
                                                         temperature=0.0, ignore_eos=True))
            for i in range(3)]
    run(make(spec, runner), reqs)
    for b in runner.batches:  # drafts only in steps that ran at most two sequences
        if any(c.num_draft for c in b.chunks):
            assert len(b.chunks) <= 2
    assert any(c.num_draft for b in runner.batches for c in b.chunks)


def test_measured_cost_stops_drafts_that_do_not_pay():
    """With rows costing most of a step, the model that breaks its period every 13th
    token (drafts kept ~70%) still drafts; one whose drafts are never right stops
    drafting almost entirely, and outputs are unchanged either way."""
    def never(seq):  # a function of the position: what followed before never follows now
        return random.Random(len(seq) * 1000 + seq[-1]).randrange(1, VOCAB)

    for next_fn, min_rate in ((periodic, 0.3), (never, None)):
        counter = SpecCounter()
        eng = make(SPEC, CacheCheckingRunner(block_size=4, next_fn=next_fn), counter)
        eng.spec.cost = FixedShare(0.5)  # a row costs as much as the rest of the step
        reqs = [("a", [3, 1, 4, 1, 5, 9, 2, 6], SamplingParams(max_tokens=60,
                                                                temperature=0.0))]
        got = flat(run(eng, reqs)["a"])
        assert got == flat(run(make(None, CacheCheckingRunner(block_size=4,
                                                              next_fn=next_fn)), reqs)["a"])
        if min_rate is None:
            assert counter.drafts <= 8  # backoff after misses: 1, 3, 7, 15, ... skipped
        else:
            assert counter.accepted / counter.drafted > min_rate


def test_engine_fits_the_cost_from_timed_decode_steps():
    eng = make(SPEC, CacheCheckingRunner(block_size=4, next_fn=periodic, delay_s=0.002))
    from engine.spec.cost import StepCost

    eng.spec.cost = StepCost()
    run(eng, [("a", [3, 1, 4, 1, 5, 9, 2, 6], SamplingParams(max_tokens=40,
                                                              temperature=0.0))])
    # decode steps were timed: the fit gives a one-row step a cost (with noisy timings
    # the intercept alone may clamp to 0 while the slope takes the time)
    cost = eng.spec.cost
    assert cost.fitted and cost.a + cost.b > 0


def test_exhausted_sequences_have_no_room():
    dec = make(SPEC).spec
    assert dec.room(DraftLimits(0, (1, 2), (3,), 10)) == 4
    assert dec.room(DraftLimits(0, (1, 2), (3,), 3)) == 1
    assert dec.room(DraftLimits(0, (1, 2), (3,), 2)) == 0
    assert dec.room(DraftLimits(0, (1,) * 90, (3,) * 4, 50)) == 2
