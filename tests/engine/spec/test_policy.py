"""The draft-length policy (engine/spec/policy.py)."""

import math

import pytest

from engine.spec.policy import CREDIT_CAP, MAX_BACKOFF, PRIOR_P, WASTE_RATE, DraftPolicy


def test_free_rows_draft_the_whole_room_and_misses_back_off():
    b = DraftPolicy()
    assert b.length(0.0, 4) == 4
    b.record(0, 4)  # nothing kept: a miss, sit out one chance
    assert [b.length(0.0, 4) for _ in range(2)] == [0, 4]
    b.record(0, 4)
    assert [b.length(0.0, 4) for _ in range(4)] == [0, 0, 0, 4]
    b.record(2, 4)  # kept some: the misses clear
    assert b.misses == 0 and b.length(0.0, 4) == 4
    for _ in range(20):
        b.record(0, 4)
    assert b.skip == 2 ** MAX_BACKOFF - 1


def test_length_is_the_largest_i_with_p_to_the_i_above_the_cost():
    b = DraftPolicy(kept=9.0, rejected=1.0)  # p = 0.9
    assert b.accept_prob == pytest.approx(0.9)
    assert b.best_length(0.5, 8) == math.floor(math.log(0.5) / math.log(0.9)) == 6
    assert b.best_length(0.5, 3) == 3  # capped by the room
    assert b.best_length(0.95, 8) == 0  # p <= cost: nothing pays
    assert DraftPolicy(kept=6.0, rejected=4.0).best_length(0.5, 8) == 1  # 0.6 > 0.5 > 0.36


def test_the_estimate_follows_the_text():
    b = DraftPolicy()
    for _ in range(10):
        b.record(4, 4, cost=0.3)  # repetitive: every draft kept whole
    assert b.accept_prob > 0.99 and b.length(0.3, 4) == 4
    for _ in range(12):
        b.record(0, 4)  # no longer: the estimate drops below the cost
    assert b.accept_prob < 0.3
    b.misses = b.skip = 0
    assert b.length(0.3, 4) == 0 and b.misses == 1  # starts backing off by itself
    assert b.length(0.3, 4) == 0 and b.length(0.3, 4) == 1  # sat out one, then a probe


def test_a_draft_pays_only_if_its_kept_tokens_beat_the_cost():
    b = DraftPolicy()
    b.record(1, 4, cost=0.2)  # 1 > 0.8: paid
    assert b.misses == 0
    b.record(1, 4, cost=0.3)  # 1 < 1.2: did not pay
    assert b.misses == 1 and b.skip == 1


def test_probes_are_one_token_where_rows_cost_and_one_lucky_draft_does_not_end_a_backoff():
    b = DraftPolicy(kept=1.0, rejected=4.0)  # p = 0.2
    assert b.length(0.5, 4) == 0 and b.misses == 1  # starts backing off
    assert b.length(0.5, 4) == 0  # sits out one chance
    assert b.length(0.5, 4) == 1  # then probes with a single token
    b.record(1, 1, cost=0.5)  # kept it, but p = (0.8 + 1) / (1.8 + 3.2) is still < 0.5
    assert b.misses == 2 and b.skip == 3


def test_the_first_draft_follows_the_cost_of_rows():
    assert DraftPolicy().accept_prob == pytest.approx(PRIOR_P)
    assert DraftPolicy().length(0.1, 8) == 8  # nearly free: the whole room
    assert DraftPolicy().length(0.5, 8) == math.floor(math.log(0.5) / math.log(PRIOR_P)) == 3
    b = DraftPolicy()
    assert b.length(0.85, 8) == 0 and b.misses == 1  # rows cost more than p: wait
    assert b.length(0.85, 8) == 0 and b.length(0.85, 8) == 1  # then a one-token probe


@pytest.mark.parametrize("cost", [0.3, 0.85])
def test_probes_on_text_without_matches_waste_a_bounded_share(cost):
    b, chances, wasted = DraftPolicy(), 2000, 0.0
    for _ in range(chances):
        k = b.length(cost, 4)
        if k:
            b.record(0, k, cost)  # every draft rejected
            wasted += cost * k
    # the budget: what it starts with, what it earns, and one overdraft of a draft's rows
    assert wasted <= CREDIT_CAP + WASTE_RATE * chances + cost * 4
    assert wasted > 0  # it does keep probing


def test_a_probe_waits_for_credit_where_rows_cost_most_of_a_step():
    b = DraftPolicy(kept=1.0, rejected=4.0, credit=0.5)  # p = 0.2
    assert [b.length(0.9, 4) for _ in range(2)] == [0, 0]  # starts backing off, sits out one
    n = 0
    while b.length(0.9, 4) == 0:
        n += 1
    assert 0.9 <= b.credit < 0.9 + WASTE_RATE  # it probed once the credit reached the cost
    assert n >= (0.9 - 0.52) / WASTE_RATE - 2  # after waiting for it
