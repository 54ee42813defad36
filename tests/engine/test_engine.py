"""Engine loop with the real sampler and a fake runner / detokenizer."""

import asyncio
import threading
import time

import pytest

from engine.config import EngineConfig
from engine.engine import Engine
from engine.request import (
    EngineUnavailableError,
    FinishReason,
    InvalidRequestError,
    QueueFullError,
)
from engine.sampling_params import SamplingParams
from engine.stream import AsyncStream, EngineObserver
from tests.engine.fake_runner import (
    CacheCheckingRunner,
    FakeDetokenizer,
    FakeTokenizer,
    expected_tokens,
)

GREEDY = dict(temperature=0.0, ignore_eos=True)


class Recorder(EngineObserver):
    def __init__(self):
        self.events = []

    def on_rejected(self, reason):
        self.events.append(("rejected", reason))

    def on_first_token(self, ttft):
        self.events.append(("ttft", ttft))

    def on_finished(self, reason, e2e, n, tag=""):
        self.events.append(("finished", reason, n))


def make_engine(runner=None, clock=time.monotonic, **kw):
    cfg = EngineConfig(model_dir=".", max_num_seqs=kw.pop("max_num_seqs", 4),
                       max_model_len=kw.pop("max_model_len", 64),
                       max_num_batched_tokens=kw.pop("budget", 16),
                       scheduling_policy=kw.pop("scheduling_policy", "fcfs"),
                       logprobs_mode=kw.pop("logprobs_mode", "processed_logprobs"))
    return Engine(runner or CacheCheckingRunner(), FakeTokenizer(), cfg,
                  detokenizer=FakeDetokenizer, clock=clock, **kw)


def collect(engine, rid, prompt, params, **kw):
    outs = []
    engine.add_request(rid, prompt, params, outs.append, **kw)
    return outs


def run_all(engine, max_steps=1000):
    for _ in range(max_steps):
        engine.step()
        if not engine._live and engine.stats().num_waiting == 0:
            return
    raise AssertionError("engine did not finish")


def test_outputs_match_expected_and_stream_incrementally():
    eng = make_engine()
    outs = collect(eng, "a", [3, 4, 5], SamplingParams(max_tokens=5, **GREEDY))
    run_all(eng)
    want = expected_tokens([3, 4, 5], 5)
    assert [o.token_ids[0] for o in outs] == want
    assert "".join(o.text for o in outs) == "".join(f" {t}" for t in want if t)
    assert [o.finished for o in outs] == [False] * 4 + [True]
    assert outs[-1].finish_reason is FinishReason.LENGTH and outs[-1].num_output_tokens == 5


def test_eos_stop_token_and_stop_string():
    eng = make_engine()
    prompt = [49, 1]  # next tokens: (50+2)%50=2, ...
    seq = expected_tokens(prompt, 20)
    stop_tok = seq[3]
    a = collect(eng, "a", prompt, SamplingParams(max_tokens=20, temperature=0.0,
                                                 stop_token_ids=[stop_tok]))
    b = collect(eng, "b", prompt, SamplingParams(max_tokens=20, stop=[f" {seq[2]}"], **GREEDY))
    run_all(eng)
    assert [o.token_ids[0] for o in a] == seq[:4]
    assert a[-1].finish_reason is FinishReason.STOP and a[-1].stop_reason == stop_tok
    assert b[-1].finish_reason is FinishReason.STOP and b[-1].stop_reason == f" {seq[2]}"
    assert "".join(o.text for o in b) == f" {seq[0]} {seq[1]}"


def test_a_stop_token_id_is_text_only_when_asked_and_eos_is_checked_first():
    """vLLM's rules: the stop token id that ends a request is left out of its text unless
    include_stop_str_in_output; an EOS listed in stop_token_ids ends it as EOS
    (stop_reason None)."""
    prompt = [49, 1]
    seq = expected_tokens(prompt, 20)
    stop_tok = seq[3]
    eng = make_engine()
    outs = {inc: collect(eng, f"r{inc}", prompt, SamplingParams(
        max_tokens=20, temperature=0.0, stop_token_ids=[stop_tok],
        include_stop_str_in_output=inc)) for inc in (False, True)}
    run_all(eng)
    for inc, got in outs.items():
        shown = seq[:4] if inc else seq[:3]
        assert "".join(o.text for o in got) == "".join(f" {t}" for t in shown)
        assert got[-1].stop_reason == stop_tok and got[-1].token_ids == (stop_tok,)
    eos_at_3 = CacheCheckingRunner(next_fn=lambda s: 0 if len(s) >= 4 else 7)
    eng = make_engine(eos_at_3)
    got = collect(eng, "e", [1, 2], SamplingParams(max_tokens=9, temperature=0.0,
                                                   stop_token_ids=[0]))
    run_all(eng)
    assert [o.token_ids[0] for o in got] == [7, 7, 0]
    assert got[-1].finish_reason is FinishReason.STOP and got[-1].stop_reason is None


def test_filters_that_leave_no_token_end_the_request_as_its_own_error():
    """allowed_token_ids holding only the EOS that min_tokens holds back: no token is
    left, and the request ends with its own (400) error, not a token it excluded."""
    eng = make_engine()
    bad = collect(eng, "bad", [1, 2], SamplingParams(max_tokens=4, temperature=0.0,
                                                     allowed_token_ids=[0], min_tokens=2))
    good = collect(eng, "good", [1, 2], SamplingParams(max_tokens=3, **GREEDY))
    run_all(eng)
    assert bad[-1].finish_reason is FinishReason.ERROR and bad[-1].error_from_request
    assert "no token is left" in bad[-1].error and "min_tokens" in bad[-1].error
    assert not any(o.token_ids for o in bad)
    assert [o.token_ids[0] for o in good] == expected_tokens([1, 2], 3)


def test_the_engine_reports_logprobs_in_its_mode():
    """EngineConfig.logprobs_mode (--logprobs-mode) reaches the sampler: raw_logprobs
    reports the model's own distribution, unmoved by logit_bias."""
    got = {}
    for mode in ("processed_logprobs", "raw_logprobs"):
        eng = make_engine(logprobs_mode=mode)
        outs = collect(eng, "a", [3, 4], SamplingParams(
            max_tokens=1, temperature=0.0, logprobs=0, logit_bias={7: 19.0}))
        run_all(eng)
        got[mode] = outs[-1].logprobs[0].logprob
    assert got["raw_logprobs"] == pytest.approx(0.0, abs=1e-3)  # the model's sure pick
    assert got["processed_logprobs"] < got["raw_logprobs"] - 1e-3  # token 7's bias moved it


def test_concurrent_requests_equal_solo_runs_under_kv_pressure():
    prompts = [[i + 1, 2 * i + 3, 7] * (1 + i % 3) for i in range(8)]
    eng = make_engine(CacheCheckingRunner(num_kv_blocks=12, block_size=4), budget=8)
    got = [collect(eng, f"r{i}", p, SamplingParams(max_tokens=10, **GREEDY))
           for i, p in enumerate(prompts)]
    run_all(eng)
    for p, outs in zip(prompts, got, strict=True):
        assert [o.token_ids[0] for o in outs] == expected_tokens(p, 10)
    assert eng.stats().kv_cache_usage == 0.0


def test_failure_in_one_request_leaves_others_running():
    runner = CacheCheckingRunner(fail_on_token=42)
    eng = make_engine(runner)
    bad = collect(eng, "bad", [42, 1], SamplingParams(max_tokens=4, **GREEDY))
    good = collect(eng, "good", [5, 6], SamplingParams(max_tokens=4, **GREEDY))
    run_all(eng)
    assert bad[-1].finish_reason is FinishReason.ERROR and "poisoned" in bad[-1].error
    assert [o.token_ids[0] for o in good] == expected_tokens([5, 6], 4)
    assert eng.stats().state == "ready"


def test_sampling_failure_is_isolated():
    eng = make_engine()
    # logit_bias naming a token outside the vocabulary makes the sampler raise for that row
    bad = collect(eng, "bad", [1, 2], SamplingParams(max_tokens=3, logit_bias={999: 1.0},
                                                     **GREEDY))
    good = collect(eng, "good", [1, 2], SamplingParams(max_tokens=3, **GREEDY))
    run_all(eng)
    assert bad[-1].finish_reason is FinishReason.ERROR
    assert [o.token_ids[0] for o in good] == expected_tokens([1, 2], 3)


def test_validation_queue_limit_and_rejection_counting():
    rec = Recorder()
    eng = make_engine(max_model_len=10, max_queue=1, max_num_seqs=1, observer=rec)
    with pytest.raises(InvalidRequestError) as ei:
        collect(eng, "x", [1] * 8, SamplingParams(max_tokens=3))
    assert ei.value.param == "max_tokens"
    collect(eng, "a", [1], SamplingParams(max_tokens=2))  # takes the only slot
    collect(eng, "b", [1], SamplingParams(max_tokens=2))  # waits: queue now full
    with pytest.raises(QueueFullError):
        collect(eng, "c", [1], SamplingParams(max_tokens=2))
    with pytest.raises(InvalidRequestError) as ei:
        collect(eng, "y", [1] * 10, SamplingParams(max_tokens=None))
    assert ei.value.param == "prompt"
    assert [e[0] for e in rec.events] == ["rejected"] * 3
    # a caller's own submission (a beam search's next step, which waits out the queue)
    # is refused the same way but not counted: no client was refused
    with pytest.raises(QueueFullError):
        collect(eng, "d", [1], SamplingParams(max_tokens=2), count_refusal=False)
    assert len(rec.events) == 3
    run_all(eng)
    collect(eng, "c", [1], SamplingParams(max_tokens=2))  # room again once drained


def test_an_empty_prompt_is_refused_naming_the_prompt():
    """No token to attend to: a 400 naming the prompt (it was a ValueError, a 500)."""
    eng = make_engine()
    with pytest.raises(InvalidRequestError) as ei:
        collect(eng, "x", [], SamplingParams(max_tokens=2))
    assert ei.value.param == "prompt" and "empty" in str(ei.value)
    outs = collect(eng, "y", [1], SamplingParams(max_tokens=2))  # the engine goes on
    run_all(eng)
    assert outs and outs[-1].finished


def test_priority_needs_priority_scheduling_and_orders_the_queue():
    rec = Recorder()
    fcfs = make_engine(observer=rec)
    with pytest.raises(InvalidRequestError) as ei:
        collect(fcfs, "x", [1, 2], SamplingParams(max_tokens=2), priority=1)
    assert ei.value.param == "priority" and "--scheduling-policy" in str(ei.value)
    assert rec.events == [("rejected", "InvalidRequestError")]  # counted like any refusal
    eng = make_engine(max_num_seqs=1, scheduling_policy="priority")
    done = []
    outs = {}
    for rid, prio in [("a", 3), ("b", 0), ("c", 1), ("d", -1)]:
        outs[rid] = []
        eng.add_request(rid, [ord(rid), 2], SamplingParams(max_tokens=3, **GREEDY),
                        lambda o, rid=rid: (outs[rid].append(o),
                                            o.finished and done.append(rid)),
                        priority=prio)
    run_all(eng)
    assert done == ["d", "b", "c", "a"]  # all waited for the one slot: lowest first
    for rid, got in outs.items():
        assert [o.token_ids[0] for o in got] == expected_tokens([ord(rid), 2], 3)


def test_abort_and_timeout_free_kv():
    now = [0.0]
    eng = make_engine(clock=lambda: now[0])
    a = collect(eng, "a", [1, 2, 3], SamplingParams(max_tokens=30, **GREEDY))
    t = collect(eng, "t", [4, 5], SamplingParams(max_tokens=30, **GREEDY), timeout=5.0)
    eng.step()
    eng.step()
    assert eng.stats().kv_cache_usage > 0
    eng.abort("a")
    now[0] = 6.0
    eng.step()
    assert a[-1].finish_reason is FinishReason.ABORT
    assert t[-1].finish_reason is FinishReason.TIMEOUT and t[-1].error
    assert eng.stats().kv_cache_usage == 0.0 and eng.stats().num_running == 0


def test_thread_loop_with_async_streams_and_drain():
    async def main():
        eng = make_engine()
        eng.start()
        loop = asyncio.get_running_loop()
        streams = [AsyncStream(f"s{i}", loop) for i in range(3)]
        for i, s in enumerate(streams):
            eng.add_request(s.request_id, [i + 1, 9], SamplingParams(max_tokens=6, **GREEDY),
                            s.put)
        eng.begin_drain()
        with pytest.raises(EngineUnavailableError) as ei:
            eng.add_request("late", [1], SamplingParams(max_tokens=1), lambda o: None)
        assert ei.value.state == "draining"
        # a request the server admitted before the drain (drain_ok) is still taken
        late = AsyncStream("admitted", loop)
        eng.add_request("admitted", [4, 9], SamplingParams(max_tokens=6, **GREEDY), late.put,
                        drain_ok=True)
        streams.append(late)
        results = []
        for s in streams:
            results.append([o.token_ids[0] async for o in s])
        eng.shutdown()
        return results

    results = asyncio.run(main())
    assert results == [expected_tokens([i + 1, 9], 6) for i in range(3)] + [
        expected_tokens([4, 9], 6)]


def test_engine_death_fails_requests_and_flips_state():
    class Exploding(CacheCheckingRunner):
        pass

    eng = make_engine(Exploding())
    eng.steps.run = lambda out, live: (_ for _ in ()).throw(MemoryError("boom"))
    done = threading.Event()
    outs = []

    def sink(o):
        outs.append(o)
        if o.finished:
            done.set()

    eng.start()
    eng.add_request("a", [1, 2], SamplingParams(max_tokens=3, **GREEDY), sink)
    assert done.wait(5)
    assert outs[-1].finish_reason is FinishReason.ERROR and "engine died" in outs[-1].error
    assert eng.stats().state == "dead"
    with pytest.raises(EngineUnavailableError):
        eng.add_request("b", [1], SamplingParams(max_tokens=1), sink)


class StepRecorder(EngineObserver):
    def __init__(self):
        self.steps = []

    def on_step(self, seconds, num_decode_rows, num_prefill_tokens):
        assert seconds >= 0
        self.steps.append((num_decode_rows, num_prefill_tokens))


def test_on_step_reports_each_steps_decode_rows_and_prompt_tokens():
    rec = StepRecorder()
    eng = make_engine(observer=rec, budget=16)
    collect(eng, "a", [1, 2, 3], SamplingParams(max_tokens=4, ignore_eos=True))
    eng.step()  # prefills a's 3-token prompt
    eng.step()  # a decodes
    collect(eng, "b", list(range(1, 11)), SamplingParams(max_tokens=2, ignore_eos=True))
    run_all(eng)
    assert rec.steps[:3] == [(0, 3), (1, 0), (1, 10)]  # the third step is mixed
    assert sum(d for d, _ in rec.steps) == 3 + 1  # a: 3 decode tokens, b: 1
    assert sum(p for _, p in rec.steps) == 3 + 10


def test_an_eos_other_than_the_tokenizers_own_reports_its_id_as_stop_reason():
    """vLLM's: generation_config's extra EOS ids end a request as stop token ids do
    (stop_reason the id); the tokenizer's own EOS leaves stop_reason None."""
    class TwoEos(FakeTokenizer):
        eos_token_ids = (0, 5)
        primary_eos_id = 0

    for eos, want in ((5, 5), (0, None)):
        runner = CacheCheckingRunner(next_fn=lambda s, eos=eos: eos if len(s) >= 4 else 7)
        cfg = EngineConfig(model_dir=".", max_num_seqs=4, max_model_len=64,
                           max_num_batched_tokens=16)
        eng = Engine(runner, TwoEos(), cfg, detokenizer=FakeDetokenizer)
        got = collect(eng, "e", [1, 2], SamplingParams(max_tokens=9, temperature=0.0))
        run_all(eng)
        assert [o.token_ids[0] for o in got] == [7, 7, eos]
        assert got[-1].finish_reason is FinishReason.STOP and got[-1].stop_reason == want
        assert "".join(o.text for o in got) == " 7 7"  # an ending EOS is never text
