"""Predicted outputs (engine/spec/prediction.py): where the tracker stands in a prediction
as the output copies it, departs from it and comes back; and in the engine loop, with the
fake runner that reads every token back from its KV cache, a prediction never changes an
output (greedy, seeded, beside requests without one, with or without --speculative-config)
while the accepted and rejected prediction tokens it reports add up."""

from engine.sampling_params import SamplingParams
from engine.spec.decoder import PREDICTION_DRAFT_TOKENS
from engine.spec.prediction import (
    N_MIN,
    WINDOW,
    PredictionIndex,
    PredictionProposer,
    PredictionTracker,
)
from engine.spec.proposer import DraftInput
from tests.engine.fake_runner import CacheCheckingRunner
from tests.engine.spec.test_spec_engine import SPEC, SpecCounter, flat, make, prompts, run

PRED = list(range(10, 40))  # no token repeats: every n-gram is unique


def test_a_copying_output_is_offered_the_next_tokens_as_many_as_have_held():
    t = PredictionTracker(PRED)
    assert t.propose([], 4) == (10, 11)  # the start counts as N_MIN tokens
    assert t.propose([10, 11], 9) == (12, 13, 14, 15)  # 2 + 2 held
    assert t.propose(PRED[:5], 9) == (15, 16, 17, 18, 19, 20, 21)
    assert t.propose(PRED[:28], 5) == (38, 39)  # shorter at the end
    assert t.propose(PRED, 5) == ()


def test_the_prefix_is_looked_through_without_moving_the_position():
    t = PredictionTracker(PRED)
    assert t.propose([10], 2, prefix=(11, 12)) == (13, 14)
    assert t.pos == 1
    # a prefix that departs and comes back re-anchors for this proposal only
    assert t.propose([10], 2, prefix=(99, 20, 21)) == (22, 23)
    assert t.pos == 1


def test_an_insertion_loses_the_position_until_the_output_returns():
    t = PredictionTracker(PRED)
    out = [10, 11, 12, 7, 8, 9]  # three tokens the prediction does not have
    assert t.propose(out, 3) == ()
    out += [13]  # one token back in the text is not enough to re-anchor
    assert N_MIN == 2 and t.propose(out, 3) == ()
    out += [14]
    assert t.propose(out, 3) == (15, 16)  # a 2-gram re-anchored: a draft of 2
    out += [15, 16, 17]
    assert t.propose(out, 9) == (18, 19, 20, 21, 22)


def test_a_deletion_and_a_replacement_re_anchor_after_them():
    t = PredictionTracker(PRED)
    assert t.propose([10, 11, 12, 20, 21], 2) == (22, 23)  # 13..19 left out
    t = PredictionTracker(PRED)
    assert t.propose([10, 11, 99, 13, 14], 2) == (15, 16)  # 12 replaced


def test_a_repeated_passage_re_anchors_forward_of_the_last_alignment():
    block = [1, 2, 3]
    pred = [50, *block, 60, 61, *block, 70, 71, *block, 80]
    t = PredictionTracker(pred)
    out = [50, 1, 2, 3, 60, 61, 99, 2, 3]  # departs after 61, resumes in a repeat
    assert t.propose(out, 2) == (70, 71)  # the occurrence after 61, not the first
    out = [50, 1, 2, 3, 60, 61, 1, 2, 3, 70, 71, 1, 2, 3, 80, 5, 2, 3]
    t = PredictionTracker(pred)
    assert t.propose(out, 2) == (80,)  # past the end: the last occurrence


def test_the_proposer_keeps_a_tracker_per_sequence_and_an_index_per_prediction():
    p = PredictionProposer()
    asks = [DraftInput(1, [5], [10, 11], 2, (), PRED), DraftInput(2, [5], [1], 2),
            DraftInput(3, [5], [10], 2, (), list(PRED))]  # a second choice, same prediction
    assert p.propose(asks) == [(12, 13), (), (11, 12)]
    assert set(p._trackers) == {1, 3} and len(p._indexes) == 1
    assert p._trackers[1].index is p._trackers[3].index
    p.release(1)
    assert set(p._indexes) == {tuple(PRED)}
    p.release(3)
    p.release(2)
    assert not p._trackers and not p._indexes


def test_a_lookup_compares_only_the_occurrences_near_the_last_alignment():
    pred = (7, 1, 2) + (0, 1, 2) * 100 + (5,)
    index = PredictionIndex(pred)
    assert index.find([7, 1, 2], 0) == (3, 3)  # the whole suffix, at the start
    # from the end, the start's occurrence is more than WINDOW pairs away: a pair is all
    # that is found, at the last occurrence before the anchor
    assert WINDOW < 100 and index.find([7, 1, 2], len(pred)) == (len(pred) - 1, 2)


def hashed(seq):
    """A "model" with nothing periodic for an n-gram lookup to find."""
    return (sum(seq) * 7 + len(seq) * 3 + seq[-1]) % 49 + 1


def engine(spec=None, observer=None, soft=None):
    runner = CacheCheckingRunner(block_size=4, next_fn=hashed, soft=soft)
    return make(spec, runner, observer), runner


def greedy(n=40):
    return SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True, logprobs=2)


def plain_outputs(reqs, spec=None):
    eng, runner = engine(spec)
    return run(eng, reqs), runner


def tokens_of(outs):
    return [t for o in outs for t in o.token_ids]


def run_predicted(eng, reqs, preds, max_steps=5000):
    """tests/engine/spec/test_spec_engine.py's run, each request with its prediction."""
    outs = {rid: [] for rid, _, _ in reqs}
    for rid, prompt, params in reqs:
        eng.add_request(rid, prompt, params, outs[rid].append, prediction=tuple(preds[rid]))
    for _ in range(max_steps):
        eng.step()
        if not eng._live and eng.stats().num_waiting == 0:
            return outs
    raise AssertionError("engine did not finish")


def test_a_right_prediction_changes_nothing_but_the_steps():
    reqs = [(f"r{i}", p, greedy()) for i, p in enumerate(prompts(3, seed=4))]
    plain, plain_runner = plain_outputs(reqs)
    counter = SpecCounter()
    eng, runner = engine(observer=counter)
    outs = run_predicted(eng, reqs, {rid: tokens_of(plain[rid]) for rid, _, _ in reqs})
    for rid in plain:
        assert flat(outs[rid]) == flat(plain[rid]), rid
        last = outs[rid][-1]
        # all but the first token (sampled at prefill) can come from drafts
        assert last.num_rejected_prediction_tokens == 0
        assert 30 <= last.num_accepted_prediction_tokens <= 39
    assert len(runner.batches) * 3 < len(plain_runner.batches)
    st = eng.spec.stats
    assert st.num_accepted_prediction_tokens == st.num_prediction_tokens == sum(
        outs[r][-1].num_accepted_prediction_tokens for r in outs) == counter.accepted
    assert max(c.num_draft for b in runner.batches for c in b.chunks) <= (
        PREDICTION_DRAFT_TOKENS)
    assert eng.stats().kv_cache_usage == 0.0 and not eng.spec.predictions._trackers


def edited(tokens, seed):
    """``tokens`` with a few tokens replaced, one run inserted and one deleted."""
    import random
    rng = random.Random(seed)
    out = list(tokens)
    for i in rng.sample(range(len(out)), 3):
        out[i] = (out[i] + 5) % 49 + 1
    at = rng.randrange(5, len(out) - 5)
    out[at:at] = [rng.randrange(1, 50) for _ in range(4)]
    del out[at + 8:at + 11]
    return out


def test_wrong_and_partly_right_predictions_change_nothing():
    reqs = [(f"r{i}", p, greedy(48)) for i, p in enumerate(prompts(4, seed=6))]
    plain, _ = plain_outputs(reqs)
    preds = {"r0": edited(tokens_of(plain["r0"]), 1), "r1": edited(tokens_of(plain["r1"]), 2),
             "r2": [7] * 60, "r3": ()}  # r3 has none: it never drafts
    counter = SpecCounter()
    eng, runner = engine(observer=counter)
    outs = run_predicted(eng, reqs, preds)
    for rid in plain:
        assert flat(outs[rid]) == flat(plain[rid]), rid
    for rid in ("r0", "r1"):
        last = outs[rid][-1]
        assert last.num_accepted_prediction_tokens >= 20
        assert last.num_rejected_prediction_tokens >= 1
    assert outs["r3"][-1].num_accepted_prediction_tokens == 0
    assert outs["r2"][-1].num_accepted_prediction_tokens == 0
    drafted = sum(o[-1].num_accepted_prediction_tokens + o[-1].num_rejected_prediction_tokens
                  for o in outs.values())
    assert drafted == counter.drafted  # every draft token came from a prediction
    drafting = {c.seq_id for b in runner.batches for c in b.chunks if c.num_draft}
    assert drafting <= {0, 1, 2} and {0, 1} <= drafting  # seq ids in order of arrival


def test_seeded_sampling_is_the_same_with_a_prediction():
    reqs = [(f"s{i}", p, SamplingParams(max_tokens=30, temperature=0.8, top_p=0.95,
                                        seed=40 + i, logprobs=1, ignore_eos=True))
            for i, p in enumerate(prompts(4, seed=8))]
    eng, _ = engine(soft=4.5)
    plain = run(eng, reqs)
    eng, _ = engine(soft=4.5)
    outs = run_predicted(eng, reqs, {rid: edited(tokens_of(plain[rid]), 3) for rid, _, _ in reqs})
    for rid in plain:
        assert flat(outs[rid]) == flat(plain[rid]), rid
    assert sum(o[-1].num_accepted_prediction_tokens for o in outs.values()) > 0


def test_with_the_ngram_config_a_prediction_drafts_first_and_the_lookup_after_it():
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    reqs = [("a", prompt, greedy(40))]
    plain, _ = plain_outputs(reqs)
    want = tokens_of(plain["a"])
    counter = SpecCounter()
    eng, runner = engine(SPEC, counter)
    outs = run_predicted(eng, reqs, {"a": want[:20]})["a"]
    assert flat(outs) == flat(plain["a"])
    assert 15 <= outs[-1].num_accepted_prediction_tokens <= 19
    drafts = [c.num_draft for b in runner.batches for c in b.chunks if c.num_draft]
    assert max(drafts) > SPEC.num_speculative_tokens  # the prediction's longer drafts
    # past the prediction's end the n-gram lookup may still draft (within its K)
    assert counter.drafted >= (outs[-1].num_accepted_prediction_tokens
                               + outs[-1].num_rejected_prediction_tokens)
