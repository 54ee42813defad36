"""The thinking budget in the sampler (engine/sampler.py step 5): the mask starts exactly
when the open section holds ``budget`` reasoning tokens, counted after its start token (or
from the first output token when the prompt opened it), never after its end token, for
greedy and sampled rows alike, and leaves every other row of the batch bit for bit."""

import pytest
import torch

from engine.sampler import make_generator, sample, thinking_state
from engine.sampling_params import SamplingParams, SamplingParamsError, ThinkingBudget

V = 16
START, END = 3, 4  # the [THINK] / [/THINK] of these tests
GREEDY = dict(temperature=0)
SAMPLED = dict(temperature=1.0, seed=7)


def _budget(n: int, inside: bool = False) -> ThinkingBudget:
    return ThinkingBudget(START, END, n, starts_inside=inside)


def _logits(b: int = 1, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, V, generator=g)
    x[:, END] = -5.0  # the model would rather not close the section
    return x


def _step(output, budget, kw=GREEDY, logits=None, logprobs=None):
    p = SamplingParams(**kw, thinking=budget, logprobs=logprobs)
    gen = make_generator(p.seed)
    x = _logits() if logits is None else logits
    return sample(x, [p], [[1]], [list(output)], [gen])


@pytest.mark.parametrize("kw", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_the_mask_starts_exactly_at_the_budget(kw):
    for n in (0, 1, 3):
        for k in range(n + 2):
            out = [7, START] + [9] * k
            tok = _step(out, _budget(n), kw).token_ids.item()
            assert (tok == END) == (k >= n), (n, k, tok)
    # only the end token is left: its logprob is 0 (log 1) after the mask
    so = _step([START, 9, 9], _budget(2), GREEDY, logprobs=2)
    assert so.chosen_logprobs[0] == pytest.approx(0.0)
    assert so.processed[0].isinf().sum().item() == V - 1


def test_counts_after_the_start_token_not_before_it():
    # tokens before the section are not reasoning; the start token itself is not counted
    assert thinking_state(_budget(5), [9, 9, 9, START, 9, 9]) == (True, 2)
    assert _step([9] * 10 + [START, 9], _budget(2)).token_ids.item() != END
    assert _step([9] * 10 + [START, 9, 9], _budget(2)).token_ids.item() == END


def test_a_prompt_opened_section_counts_from_the_first_output_token():
    assert thinking_state(_budget(5, inside=True), []) == (True, 0)
    assert _step([], _budget(0, inside=True)).token_ids.item() == END
    assert _step([9], _budget(2, inside=True)).token_ids.item() != END
    assert _step([9, 9], _budget(2, inside=True)).token_ids.item() == END
    # the same output without the prompt's opening is not reasoning at all
    assert _step([9, 9], _budget(2)).token_ids.item() != END


@pytest.mark.parametrize("kw", [GREEDY, SAMPLED], ids=["greedy", "sampled"])
def test_not_applied_after_the_end_token(kw):
    budget = _budget(2)
    for out in ([START, 9, 9, END], [START, 9, 9, END, 9, 9, 9, 9],
                [9, 9, END, 9, 9, 9]):  # an end outside a section closes nothing
        x = _logits()
        so = _step(out, budget, kw, logits=x, logprobs=V)
        assert not so.processed.isinf().any(), out
        free = _step(out, None, kw, logits=x, logprobs=V)
        assert torch.equal(so.processed, free.processed) and so.token_ids == free.token_ids


def test_the_budget_is_the_total_over_sections():
    # a second section may not spend more than what the first left
    assert thinking_state(_budget(9), [START, 9, END, 9, START, 9, 9]) == (True, 3)
    assert _step([START, 9, END, 9, START, 9], _budget(2)).token_ids.item() == END
    # a start inside a section is a marker, not a reasoning token
    assert thinking_state(_budget(9), [START, 9, START, 9]) == (True, 2)


def test_other_rows_of_the_batch_are_bit_for_bit_unaffected():
    x = _logits(4, seed=3)
    outs = [[START, 9, 9], [START, 9, 9], [5, 6], [START, 9, 9, END, 9]]
    budgets = [_budget(2), None, _budget(2), _budget(2)]
    kws = [SAMPLED, dict(temperature=0.8, seed=11), GREEDY, dict(temperature=1.3, seed=5)]
    params = [SamplingParams(**kw, thinking=b, logprobs=3) for kw, b in zip(kws, budgets,
                                                                        strict=True)]
    batch = sample(x, params, [[1]] * 4, outs, [make_generator(p.seed) for p in params])
    assert batch.token_ids[0].item() == END
    for i in (1, 2, 3):
        alone = sample(x[i:i + 1].clone(), [params[i]], [[1]], [outs[i]],
                       [make_generator(params[i].seed)])
        assert torch.equal(batch.processed[i], alone.processed[0])
        assert batch.token_ids[i] == alone.token_ids[0]
        assert batch.top_logprobs[i] == alone.top_logprobs[0]
        assert torch.equal(batch.processed[i], x[i])  # nothing changed these rows


def test_a_grammar_that_forbids_the_end_token_wins():
    x = _logits()
    x[0, END] = float("-inf")
    so = _step([START, 9, 9], _budget(1), logits=x)
    assert so.token_ids.item() == x[0].argmax().item() != END
    assert torch.isfinite(so.processed).any()


@pytest.mark.parametrize("kw,field", [
    (dict(start_token_id=-1, end_token_id=4, budget=1), "thinking.start_token_id"),
    (dict(start_token_id=3, end_token_id=4, budget=-1), "thinking.budget"),
    (dict(start_token_id=3, end_token_id=3, budget=1), "thinking"),
    (dict(start_token_id=3, end_token_id=4, budget=True), "thinking.budget")])
def test_budget_validation_names_the_field(kw, field):
    with pytest.raises(SamplingParamsError, match=f"^{field}:"):
        ThinkingBudget(**kw)


def test_marker_ids_must_be_in_the_vocabulary():
    p = SamplingParams(thinking=ThinkingBudget(3, V + 1, 4))
    with pytest.raises(SamplingParamsError, match="^thinking:"):
        p.validate_for_vocab(V)
    SamplingParams(thinking=_budget(4)).validate_for_vocab(V)
