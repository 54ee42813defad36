import math

import pytest
import torch

from engine.sampler import (
    Sampler,
    apply_penalties,
    make_generator,
    sample,
    token_logprobs,
    truncate,
)
from engine.sampling_params import SamplingParams, SamplingParamsError

V = 8


def _run(logits, params, prompts=None, outputs=None, gens=None, eos=()):
    b = logits.shape[0]
    return sample(logits, params, prompts or [[]] * b, outputs or [[]] * b,
                  gens or [None] * b, eos)


def _processed(logits, p, prompt=(), output=(), eos=()):
    """Processed-logit row recovered from the reported logprobs (log_softmax is shift-only)."""
    out = _run(logits[None], [SamplingParams(**p, logprobs=V)], [list(prompt)], [list(output)],
               eos=eos)
    ids, lps = out.top_logprobs[0]
    row = torch.empty(V)
    row[torch.tensor(ids)] = torch.tensor(lps)
    return row


def test_greedy_is_argmax_and_logprobs_normalised():
    logits = torch.randn(3, V)
    out = _run(logits, [SamplingParams(temperature=0, logprobs=V)] * 3)
    assert out.token_ids.tolist() == logits.argmax(-1).tolist()
    assert out.token_ids.dtype == torch.int64 and out.logprobs.dtype == torch.float32
    for i, (ids, lps) in enumerate(out.top_logprobs):
        assert len(ids) == V and math.isclose(sum(math.exp(x) for x in lps), 1.0, rel_tol=1e-5)
        assert ids[0] == out.token_ids[i].item()
        assert lps[0] == pytest.approx(out.logprobs[i].item())


def test_repetition_penalty_matches_definition():
    logits = torch.tensor([2.0, -1.0, 0.5, -3.0, 1.0, 0.0, 4.0, -0.5])
    got = _processed(logits, dict(temperature=0, repetition_penalty=2.0), prompt=[0, 1],
                     output=[2, 1])
    want = logits.clone()
    want[0] = 2.0 / 2  # positive, seen in prompt: divided
    want[1] = -1.0 * 2  # negative, seen: multiplied
    want[2] = 0.5 / 2  # seen in output
    want = torch.log_softmax(want, -1)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_presence_frequency_penalties_match_definition():
    logits = torch.tensor([2.0, -1.0, 0.5, -3.0, 1.0, 0.0, 4.0, -0.5])
    got = _processed(logits, dict(temperature=0, presence_penalty=0.5, frequency_penalty=0.25),
                     prompt=[4, 5], output=[6, 6, 6, 0])
    want = logits.clone()
    want[6] -= 0.25 * 3 + 0.5  # prompt tokens 4, 5 are not penalised
    want[0] -= 0.25 * 1 + 0.5
    torch.testing.assert_close(got, torch.log_softmax(want, -1), rtol=1e-5, atol=1e-5)


def test_logit_bias_comes_before_the_penalties():
    """vLLM's order: a biased, seen token's logit is (logit + bias) / r, not logit / r + b."""
    logits = torch.tensor([2.0, -1.0, 0.5, -3.0, 1.0, 0.0, 4.0, -0.5])
    got = _processed(logits, dict(temperature=0, repetition_penalty=2.0,
                                  logit_bias={0: 3.0, 1: 4.0}), prompt=[0, 1])
    want = logits.clone()
    want[0] = (2.0 + 3.0) / 2
    want[1] = (-1.0 + 4.0) / 2  # positive once biased: divided
    torch.testing.assert_close(got, torch.log_softmax(want, -1), rtol=1e-5, atol=1e-5)


def test_penalty_changes_greedy_choice():
    logits = torch.tensor([[0.0, 3.0, 2.9, 0, 0, 0, 0, 0]])
    out = _run(logits, [SamplingParams(temperature=0, repetition_penalty=1.5)], [[1]], [[]])
    assert out.token_ids.item() == 2


def test_logit_bias_and_min_tokens():
    logits = torch.zeros(1, V)
    p = SamplingParams(temperature=0, logit_bias={5: 10.0})
    assert _run(logits, [p]).token_ids.item() == 5
    biased = torch.tensor([[0.0, 0, 9, 0, 0, 0, 0, 8]])
    p = SamplingParams(temperature=0, min_tokens=2, stop_token_ids=(7,))
    out = _run(biased, [p], outputs=[[1]], eos=(2,))
    assert out.token_ids.item() == 0  # 2 (eos) and 7 (stop id) masked
    assert out.logprobs.item() > -10
    out = _run(biased, [p], outputs=[[1, 1]], eos=(2,))
    assert out.token_ids.item() == 2  # min_tokens reached
    p = SamplingParams(temperature=0, min_tokens=2, ignore_eos=True)
    assert _run(biased, [p], outputs=[[1]], eos=(2,)).token_ids.item() == 2


def test_truncation_masks():
    y = torch.log(torch.tensor([[0.5, 0.2, 0.15, 0.1, 0.05]]))
    keep = lambda **kw: torch.isfinite(truncate(y, **{  # noqa: E731
        "top_k": torch.tensor([5]), "top_p": torch.tensor([1.0]),
        "min_p": torch.tensor([0.0]), **kw}))[0].tolist()
    assert keep(top_k=torch.tensor([2])) == [True, True, False, False, False]
    assert keep(top_p=torch.tensor([0.6])) == [True, True, False, False, False]
    assert keep(top_p=torch.tensor([0.7])) == [True, True, False, False, False]
    assert keep(top_p=torch.tensor([0.71])) == [True, True, True, False, False]
    assert keep(top_p=torch.tensor([0.1])) == [True, False, False, False, False]
    assert keep(min_p=torch.tensor([0.3])) == [True, True, True, False, False]
    assert keep(top_p=torch.tensor([1.0])) == [True] * 5


def test_sampled_tokens_stay_inside_the_mask():
    logits = torch.randn(4, 50)
    params = [SamplingParams(temperature=1.0, top_k=3, seed=i) for i in range(4)]
    top3 = logits.topk(3).indices
    for step in range(20):
        gens = [make_generator(100 * step + i) for i in range(4)]
        out = _run(logits, params, gens=gens)
        for i in range(4):
            assert out.token_ids[i].item() in top3[i].tolist()


def test_seeded_sampling_reproducible_across_batch_composition():
    torch.manual_seed(0)
    row = torch.randn(1000)
    p = SamplingParams(temperature=0.9, top_p=0.95, seed=42)

    def draw(neighbours: int) -> list[int]:
        g = make_generator(42)
        toks = []
        for _ in range(10):
            others = torch.randn(neighbours, 1000)
            logits = torch.cat([others[: neighbours // 2], row[None], others[neighbours // 2:]])
            params = [SamplingParams(temperature=1.3)] * neighbours
            params.insert(neighbours // 2, p)
            gens = [None] * neighbours
            gens.insert(neighbours // 2, g)
            out = _run(logits, params, gens=gens)
            toks.append(out.token_ids[neighbours // 2].item())
        return toks

    alone = draw(0)
    assert draw(3) == alone and draw(6) == alone
    assert len(set(alone)) > 1  # really random
    g = make_generator(43)
    other = [_run(row[None], [p], gens=[g]).token_ids.item() for _ in range(10)]
    assert other != alone


def test_sampling_frequencies_follow_temperature_scaled_distribution():
    logits = torch.tensor([[1.0, 0.0, -1.0, 2.0]])
    p = SamplingParams(temperature=0.5)
    g = make_generator(7)
    counts = torch.zeros(4)
    n = 4000
    for _ in range(n):
        counts[_run(logits, [p], gens=[g]).token_ids.item()] += 1
    want = torch.softmax(logits[0] / 0.5, -1)
    assert torch.allclose(counts / n, want, atol=0.03)


def test_sampler_class_and_prompt_logprobs():
    s = Sampler(eos_token_ids=[3])
    logits = torch.tensor([[0.0, 0, 0, 5.0]])
    out = s(logits, [SamplingParams(temperature=0, min_tokens=1)], [[]], [[]], [None])
    assert out.token_ids.item() != 3
    lps, tops, ranks = token_logprobs(torch.randn(3, V), [1, 2, 3], 2)
    assert len(lps) == 3 and all(len(t[0]) == 2 for t in tops)
    assert all(lp <= 0 for lp in lps)
    assert all(1 <= r <= V for r in ranks)
    logits = torch.tensor([[0.0, 3.0, 1.0, 3.0], [5.0, 0.0, 0.0, 0.0]])
    _, tops, ranks = token_logprobs(logits, [2, 0], 1)
    assert ranks == [3, 1]  # two ids likelier than id 2; id 0 is the best
    assert tops[1][0] == [0]


def test_batch_size_mismatch_raises():
    with pytest.raises(ValueError, match="logit rows"):
        sample(torch.zeros(2, V), [SamplingParams()], [[]], [[]], [None])


@pytest.mark.parametrize("kw, field", [
    (dict(temperature=-1), "temperature"), (dict(top_p=0), "top_p"), (dict(top_k=-2), "top_k"),
    (dict(min_p=1.5), "min_p"), (dict(max_tokens=0), "max_tokens"),
    (dict(min_tokens=5, max_tokens=2), "min_tokens"), (dict(repetition_penalty=0), "repetition"),
    (dict(presence_penalty=3), "presence_penalty"), (dict(logprobs=21), "logprobs"),
    (dict(logit_bias={1: 200}), "logit_bias"), (dict(stop=[""]), "stop"),
    (dict(temperature=float("nan")), "temperature"), (dict(seed="x"), "seed"),
])
def test_params_validation_names_field(kw, field):
    with pytest.raises(SamplingParamsError, match=field):
        SamplingParams(**kw)


def test_params_normalisation():
    p = SamplingParams(stop="###", stop_token_ids=[4, 5], logit_bias={"3": 1})
    assert p.stop == ("###",) and p.stop_token_ids == (4, 5) and dict(p.logit_bias) == {3: 1.0}
    with pytest.raises(TypeError):
        p.logit_bias[3] = 2.0  # read-only
    with pytest.raises(SamplingParamsError, match="stop_token_ids"):
        SamplingParams(stop_token_ids=(99,)).validate_for_vocab(10)


def test_plain_greedy_batch_reads_logits_without_copy_and_skips_logprobs():
    logits = torch.randn(4, 50)
    before = logits.clone()
    out = _run(logits, [SamplingParams(temperature=0)] * 4)
    assert out.processed is logits  # no copy for plain greedy rows
    assert out.token_ids.tolist() == logits.argmax(-1).tolist()
    assert out.chosen_logprobs == [None] * 4 and out.top_logprobs == [None] * 4
    torch.testing.assert_close(out.logprobs, torch.log_softmax(logits, -1).gather(
        1, out.token_ids[:, None])[:, 0])  # computed on demand
    assert torch.equal(logits, before)


def test_logprobs_only_for_rows_that_ask_and_input_untouched_by_processing():
    logits = torch.randn(3, 50)
    before = logits.clone()
    params = [SamplingParams(temperature=0), SamplingParams(temperature=0, logprobs=3),
              SamplingParams(temperature=0, logit_bias={7: 100.0})]
    out = _run(logits, params)
    assert torch.equal(logits, before) and out.processed is not logits
    assert out.token_ids[2].item() == 7
    assert out.chosen_logprobs[0] is None and out.chosen_logprobs[2] is None
    ids, lps = out.top_logprobs[1]
    assert len(ids) == 3 and ids[0] == out.token_ids[1].item()
    assert out.chosen_logprobs[1] == pytest.approx(lps[0])
    assert out.chosen_logprobs[1] == pytest.approx(out.logprobs[1].item())


def test_greedy_row_identical_alone_and_in_a_mixed_batch():
    torch.manual_seed(1)
    logits = torch.randn(5, 300)
    params = [SamplingParams(temperature=0.8, seed=3), SamplingParams(temperature=0),
              SamplingParams(temperature=0, logprobs=2), SamplingParams(temperature=1.0),
              SamplingParams(temperature=0, repetition_penalty=1.3)]
    gens = [make_generator(3), None, None, None, None]
    batch = _run(logits, params, prompts=[[1, 2]] * 5, outputs=[[4]] * 5, gens=gens)
    for i in (1, 2, 4):
        alone = _run(logits[i:i + 1], [params[i]], prompts=[[1, 2]], outputs=[[4]])
        assert alone.token_ids.item() == batch.token_ids[i].item()


@pytest.mark.parametrize("kw", [
    dict(repetition_penalty=5e-324), dict(repetition_penalty=1e300),
    dict(temperature=5e-324), dict(temperature=1e300), dict(temperature=1e-30, top_k=2**70),
    dict(repetition_penalty=1e300, temperature=1e-300, min_tokens=3),
])
def test_extreme_parameters_give_finite_logprobs_and_a_real_token(kw):
    """Overflowing factors must not turn a row into NaN (a garbage token, NaN logprobs that
    no JSON can carry): the token is the one greedy picks (or a tied one) and every
    reported logprob is finite."""
    logits = torch.tensor([[2.0, -1.0, 0.0, 3.0, -3.0, 1.0, 0.5, -0.5]])
    out = _run(logits, [SamplingParams(**kw, logprobs=V)], [[0, 1, 2, 3, 5]], [[3]], eos=[7])
    ids, lps = out.top_logprobs[0]
    assert all(math.isfinite(x) for x in lps + [out.chosen_logprobs[0]]), lps
    assert 0 <= out.token_ids[0].item() < V
    if kw.get("temperature", 1) < 1e-20:  # near-zero temperature is greedy
        assert out.token_ids[0].item() == _processed(logits[0], {
            k: v for k, v in kw.items() if k not in ("temperature", "top_k")},
            prompt=[0, 1, 2, 3, 5], output=[3], eos=[7]).argmax().item()


@pytest.mark.parametrize("temperature", [1e-39, 5e-324, 1e-6])
def test_a_tiny_temperature_with_large_logits_is_greedy(temperature):
    """Logits of a real model (tens) over a temperature below fp32's smallest normal used to
    overflow to +F32_MAX together: a near-uniform draw among every positive logit. Now the
    row's largest logit is subtracted first: every seed draws the argmax."""
    logits = torch.tensor([[21.0, -1.0, 20.5, 3.0, 19.0, 0.0, 12.0, 20.9]])
    for seed in range(20):
        out = _run(logits, [SamplingParams(temperature=temperature, seed=seed)], [[1]], [[]],
                   gens=[make_generator(seed)])
        assert out.token_ids.item() == 0, (seed, out.token_ids)


def test_any_integer_seed_is_a_generator_seed_modulo_2_64():
    def draws(seed):
        return torch.rand(4, generator=make_generator(seed))
    assert torch.equal(draws(5), draws(5 + 2**64)) and torch.equal(draws(-1), draws(2**64 - 1))
    assert torch.equal(draws(-(2**70)), draws(-(2**70) % 2**64))
    assert not torch.equal(draws(5), draws(6))
    # the 32 bits torch's generator keeps: the high ones are folded in, not dropped
    for a, b in ((0, 2**32), (1, 2**32 + 1), (2**32 + 1, 2**33 + 1), (0, -1), (-1, -(2**32) - 1)):
        assert not torch.equal(draws(a), draws(b)), (a, b)
    assert torch.equal(draws(7), torch.rand(4, generator=torch.Generator().manual_seed(7)))


@pytest.mark.parametrize("kw", [
    dict(repetition_penalty=1e300),
    dict(repetition_penalty=9.9e307, temperature=1e74, frequency_penalty=-1.9, min_p=0.86,
         top_p=0.86, min_tokens=5, stop_token_ids=[1]),
])
def test_a_huge_penalty_on_every_seen_negative_logit_keeps_logprobs_finite(kw):
    """Every token seen and every logit negative: the penalty multiplies each past fp32's
    range. A row of -inf has no distribution (NaN logprobs, a 500 at the JSON encoder), so
    penalized logits saturate at -F32_MAX; masked tokens (min_tokens) stay impossible."""
    logits = torch.tensor([[-2.0, -1.5, -3.0, -4.0, -1.25, -2.5, -1.1, -5.0]])
    out = _run(logits, [SamplingParams(**kw, logprobs=V)], [list(range(V))], [[3]], eos=[7])
    ids, lps = out.top_logprobs[0]
    assert all(math.isfinite(x) for x in lps + [out.chosen_logprobs[0]]), lps
    banned = {7, *kw.get("stop_token_ids", ())} if kw.get("min_tokens") else set()
    assert out.token_ids[0].item() not in banned
    assert all(lp == -9999.0 for i, lp in zip(ids, lps, strict=True) if i in banned)


@pytest.mark.parametrize("mode", ["processed_logprobs", "raw_logprobs", "processed_logits",
                                  "raw_logits"])
def test_logprobs_modes(mode):
    """vLLM's --logprobs-mode: raw_* report the logits as they came (under the grammar
    mask only), processed_* after logit_bias and the penalties; *_logits the values
    themselves, *_logprobs their log_softmax. The sampled token is the same in all."""
    logits = torch.tensor([[2.0, -1.0, 0.5, -3.0, 1.0, 0.0, 4.0, -0.5]])
    p = SamplingParams(temperature=0, logit_bias={0: 5.0}, repetition_penalty=2.0,
                       logprobs=V)
    out = Sampler((), mode)(logits, [p], [[6]], [[]], [None])
    processed = logits.clone()
    processed[0, 0] += 5.0
    processed[0, 6] /= 2.0
    want = logits if mode.startswith("raw") else processed
    if mode.endswith("logprobs"):
        want = torch.log_softmax(want, -1)
    ids, values = out.top_logprobs[0]
    torch.testing.assert_close(torch.tensor(values), want[0, ids], rtol=1e-5, atol=1e-5)
    assert out.token_ids.item() == 0 and out.chosen_logprobs[0] == pytest.approx(
        want[0, 0].item(), abs=1e-5)
    with pytest.raises(ValueError, match="logprobs mode"):
        Sampler((), "raw")


def _sorted_truncate(y, top_k, top_p):
    """truncate's top-k / top-p by the full (value, index) sort: the reference."""
    v = y.shape[1]
    sorted_y, order = y.sort(dim=-1, descending=True)
    drop = torch.arange(v)[None, :] >= top_k[:, None]
    sorted_y = sorted_y.masked_fill(drop, float("-inf"))
    sp = torch.softmax(sorted_y, dim=-1)
    drop |= ((sp.cumsum(dim=-1) - sp) >= top_p[:, None]) & (top_p[:, None] < 1)
    drop[:, 0] = False
    return torch.empty_like(y).scatter_(-1, order, sorted_y.masked_fill(drop, float("-inf")))


def test_truncation_by_values_equals_the_full_sort_bit_for_bit():
    """truncate keeps tokens by the value cutoff of a topk / values-only sort (no full
    index sort): the same bits as the sorted reference, ties, -0.0 and -inf included."""
    gen = torch.Generator().manual_seed(0)
    for trial in range(300):
        b, v = 3, 64
        y = torch.randn(b, v, generator=gen) * 3
        if trial % 3 == 0:
            y = y.round()  # many ties
        if trial % 5 == 0:
            y[:, ::7] = float("-inf")
            y[0, 1] = -0.0
        top_k = torch.randint(1, v + 1, (b,), generator=gen)
        if trial % 2:
            top_k[:] = v  # top_p alone
        top_p = torch.rand(b, generator=gen).clamp(min=0.05)
        got = truncate(y, top_k, top_p, torch.zeros(b))
        want = _sorted_truncate(y, top_k, top_p)
        assert torch.equal(got.isneginf(), want.isneginf()), trial
        kept = ~want.isneginf()
        assert torch.equal(got[kept], want[kept]), trial


def test_penalties_on_seen_tokens_only_equal_the_dense_formula():
    gen = torch.Generator().manual_seed(1)
    for trial in range(100):
        x = torch.randn(2, V, generator=gen) * 4
        x[0, 3], x[1, 5] = float("inf"), float("-inf")
        params = [SamplingParams(temperature=0, repetition_penalty=1.5,
                                 frequency_penalty=0.5 * (trial % 3),
                                 presence_penalty=0.25 * (trial % 2)) for _ in range(2)]
        prompts = [[0, 3], [5, 6]]
        outputs = [[1, 1, 7], [2]]
        got = x.clone()
        apply_penalties(got, params, prompts, outputs)
        want = x.clone()
        for i, p in enumerate(params):
            counts = torch.zeros(V)
            for t in outputs[i]:
                counts[t] += 1
            seen = counts > 0
            seen[prompts[i]] = True
            row = want[i]
            y = torch.where(seen, torch.where(row > 0, row / 1.5, row * 1.5), row)
            y = torch.where(row == float("-inf"), row, y.clamp(-3.4028234663852886e38,
                                                                3.4028234663852886e38))
            want[i] = y - p.frequency_penalty * counts - p.presence_penalty * seen.float() * (
                counts > 0).float()
        assert torch.equal(got, want), trial
