"""Prompt lookup (engine/spec/ngram.py) and the step cost fit (engine/spec/cost.py)."""

import pytest

from engine.spec.ngram import NgramIndex, NgramProposer
from engine.spec.proposer import DraftInput


def naive(tokens, n_min, n_max, k):
    """The definition: the latest earlier occurrence of the longest suffix n-gram."""
    size = len(tokens)
    for n in range(min(n_max, size - 1), n_min - 1, -1):
        suffix = tokens[size - n:]
        for e in range(size - 1, n - 1, -1):
            if tokens[e - n:e] == suffix:
                return tuple(tokens[e:e + k])
    return ()


def test_latest_earlier_occurrence_of_the_longest_suffix():
    idx = NgramIndex(1, 3)
    idx.extend([5, 6, 7, 8, 1, 6, 7, 9, 2, 6, 7])
    # suffix (6, 7): latest earlier occurrence ends at 7 (followed by 9 2 6 7); the 3-gram
    # (2, 6, 7) never occurred before
    assert idx.propose(3) == (9, 2, 6)
    assert idx.propose(10) == (9, 2, 6, 7)  # runs up to the end of the sequence


def test_no_match_and_too_short():
    idx = NgramIndex(2, 3)
    idx.extend([1, 2, 3, 4])
    assert idx.propose(4) == ()
    empty = NgramIndex(1, 1)
    assert empty.propose(2) == ()
    empty.extend([7])
    assert empty.propose(2) == ()  # a lone token has no earlier occurrence


def test_incremental_extension_matches_the_definition():
    import random

    rng = random.Random(3)
    idx = NgramIndex(2, 4)
    tokens: list[int] = []
    for step in range(400):
        new = [rng.randrange(6) for _ in range(rng.randrange(1, 4))]
        tokens += new
        idx.extend(new)
        assert idx.propose(5) == naive(tokens, 2, 4, 5), step


def test_bad_sizes_are_refused():
    with pytest.raises(ValueError):
        NgramIndex(3, 2)
    with pytest.raises(ValueError):
        NgramIndex(0, 2)


def test_proposer_keeps_one_index_per_sequence_and_forgets_it():
    prop = NgramProposer(1, 2)
    a = DraftInput(1, (4, 5, 6, 4), (5,), 2)
    b = DraftInput(2, (9, 9), (), 3)
    assert prop.propose([a, b]) == [(6, 4), (9,)]
    # the output grows: only the new tokens are indexed
    assert prop.propose([DraftInput(1, (4, 5, 6, 4), (5, 6, 4), 2)]) == [(5, 6)]
    prop.release(1)
    assert 1 not in prop._index and 2 in prop._index


def test_step_cost_fits_fixed_and_per_row_seconds():
    from engine.spec.cost import PRIOR_FIXED_ROWS, StepCost

    c = StepCost()
    assert c.row_share(16) == 16 / (16 + PRIOR_FIXED_ROWS)  # unfitted: the prior
    assert c.row_share(1) == 1 / (1 + PRIOR_FIXED_ROWS)
    for i in range(200):
        rows = 1 + i % 5
        c.observe(rows, 0.02 + 0.005 * rows)
    assert c.a == pytest.approx(0.02, rel=1e-6) and c.b == pytest.approx(0.005, rel=1e-6)
    assert c.row_share(1) == pytest.approx(0.005 / 0.025)
    assert c.row_share(16) == pytest.approx(0.08 / 0.1)
    flat = StepCost()
    for _ in range(50):
        flat.observe(4, 0.1)  # no spread in rows: no slope, everything is fixed cost
    assert flat.b == 0.0 and flat.a == pytest.approx(0.1) and not flat.fitted
    assert flat.row_share(4) == 4 / (4 + PRIOR_FIXED_ROWS)  # still the prior


def test_lookup_after_a_draft_prefix_continues_past_it():
    """``extra`` (a grammar's forced tokens): the suffix of tokens + extra is looked up in
    the indexed tokens, and a continuation that reaches their end runs on into extra."""
    import random

    rng = random.Random(5)
    for _ in range(300):
        tokens = [rng.randrange(5) for _ in range(rng.randrange(2, 30))]
        extra = [rng.randrange(5) for _ in range(rng.randrange(0, 4))]
        idx = NgramIndex(1, 3)
        idx.extend(tokens)
        seq, got = tokens + extra, idx.propose(4, extra)
        want = ()
        for n in range(min(3, len(seq) - 1), 0, -1):
            ends = [e for e in range(len(tokens) - 1, n - 1, -1) if seq[e - n:e] == seq[-n:]]
            if ends:
                want = tuple(seq[ends[0]:ends[0] + 4])
                break
        assert got == want, (tokens, extra)
    prop = NgramProposer(1, 2)
    draft = DraftInput(0, (7, 8, 9, 1, 2), (7,), 3, prefix=(8,))
    assert prop.propose([draft]) == [(9, 1, 2)]
