"""engine.beam.BeamSearch against vLLM's beam search written out plainly (every step run,
no early end), on synthetic models: each prefix's next-token logprobs a fixed random
function of the prefix. The answers must be the same beams in the same order, for widths,
length penalties, stop sets and lengths; the early end must have happened in some of them
(else that path went untested)."""

from __future__ import annotations

import math
import random

import pytest

from engine.beam import BeamSearch, beam_score

VOCAB = 12


def model(seed: int, prefix: tuple[int, ...], k: int) -> list[tuple[int, float]]:
    """The k likeliest next tokens after ``prefix``, best first (a random distribution
    over VOCAB tokens, fixed per seed and prefix)."""
    rng = random.Random(hash((seed, prefix)))
    logits = [rng.gauss(0, 2) for _ in range(VOCAB)]
    top = max(logits)
    norm = top + math.log(sum(math.exp(x - top) for x in logits))
    lps = sorted(((t, x - norm) for t, x in enumerate(logits)), key=lambda p: -p[1])
    return lps[:k]


def reference(seed: int, prompt_len: int, width: int, max_tokens: int, stop: set[int],
              lp: float) -> list[tuple[tuple[int, ...], float]]:
    """vLLM's loop: every step, every live beam's 2 x width candidates; stop tokens go to
    the completed list, the best width others stay; the best width of all at the end."""
    def key(b):
        tokens, cum = b
        length = prompt_len + len(tokens) - (1 if tokens and tokens[-1] in stop else 0)
        return cum / (length ** lp)

    beams: list[tuple[tuple[int, ...], float]] = [((), 0.0)]
    completed = []
    for _ in range(max_tokens):
        new = []
        for tokens, cum in beams:
            for t, lpv in model(seed, tokens, 2 * width):
                (completed if t in stop else new).append((tokens + (t,), cum + lpv))
        beams = sorted(new, key=key, reverse=True)[:width]
    return sorted(completed + beams, key=key, reverse=True)[:width]


def run(seed: int, prompt_len: int, width: int, max_tokens: int, stop: set[int],
        lp: float) -> BeamSearch:
    s = BeamSearch(prompt_len, width, max_tokens, frozenset(stop), lp)
    while not s.done:
        s.advance([model(seed, b.tokens, s.candidates) for b in s.live])
    return s


@pytest.mark.parametrize("lp", [-1.0, 0.0, 0.5, 1.0, 2.0])
@pytest.mark.parametrize("width", [1, 2, 4])
def test_the_answer_is_vllms(width, lp):
    early = 0
    for seed in range(40):
        stop = {seed % VOCAB, (seed * 7) % VOCAB}
        max_tokens = 3 + seed % 6
        s = run(seed, 5, width, max_tokens, stop, lp)
        want = reference(seed, 5, width, max_tokens, stop, lp)
        got = [(b.tokens, b.cum_logprob) for b in s.best()]
        assert [t for t, _ in got] == [t for t, _ in want], seed
        assert [c for _, c in got] == pytest.approx([c for _, c in want], abs=1e-12)
        early += s.steps < max_tokens
    if lp <= 0.5:  # where the bound is tight enough to end early, it did (and changed
        assert early > 0  # nothing); with larger penalties long beams may still win


def test_a_beam_records_what_each_step_offered():
    s = run(3, 4, 2, 5, set(), 1.0)
    for b in s.best():
        assert len(b.steps) == len(b.tokens) == 5 and not b.stopped
        assert sum(b.logprobs) == pytest.approx(b.cum_logprob, abs=1e-12)
        for t, offered in zip(b.tokens, b.steps, strict=True):
            assert len(offered) == 4 and t in dict(offered)


def test_width_one_is_greedy():
    s = run(11, 3, 1, 6, set(), 1.0)
    tokens: tuple[int, ...] = ()
    for _ in range(6):
        tokens += (model(11, tokens, 1)[0][0],)
    assert s.best()[0].tokens == tokens


def test_the_score_does_not_count_the_stop_token():
    s = BeamSearch(10, 1, 4, frozenset({7}), 1.0)
    s.advance([[(7, -0.5), (3, -0.25)]])
    stopped = s.finished[0]
    assert stopped.stopped and s.score(stopped) == beam_score(-0.5, 10, 1.0)
    assert s.score(s.live[0]) == beam_score(-0.25, 11, 1.0)


def test_no_live_beam_left_ends_the_search():
    s = BeamSearch(2, 2, 8, frozenset({1, 2}), 1.0)
    s.advance([[(1, -0.1), (2, -0.2)]])  # every candidate stops a beam
    assert s.done and [b.tokens for b in s.best()] == [(1,), (2,)]


@pytest.mark.parametrize("lp", [-400.0, 400.0])
def test_an_extreme_length_penalty_ranks_by_length(lp):
    """cum / L ** 400 overflows a float; the ranking is still the limit's: the longest
    beams first for a large penalty, the shortest for a large negative one."""
    s = run(5, 20, 3, 6, {0, 1, 2}, lp)
    lengths = [len(b.tokens) - b.stopped for b in s.best()]
    assert lengths == sorted(lengths, reverse=lp > 0)


def test_a_token_without_probability_is_never_taken():
    s = BeamSearch(2, 2, 1, frozenset(), 1.0)
    s.advance([[(4, -1.0), (5, -math.inf)]])
    assert [b.tokens for b in s.best()] == [(4,)]


@pytest.mark.parametrize("args", [(3, 0, 4), (3, 2, 0)])
def test_width_and_length_must_be_positive(args):
    with pytest.raises(ValueError):
        BeamSearch(args[0], args[1], args[2], frozenset())


def test_candidates_must_match_the_live_beams():
    s = BeamSearch(2, 2, 3, frozenset())
    with pytest.raises(ValueError):
        s.advance([[(1, -0.1)], [(2, -0.1)]])
