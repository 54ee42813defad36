"""engine/structured/token_mask.py and the sampler's use of it (pure torch)."""

from __future__ import annotations

import pytest
import torch

from engine.sampler import sample
from engine.sampling_params import SamplingParams
from engine.structured import TokenMask, apply_token_mask


def _bits(allowed_sets, vocab):
    bits = torch.zeros(len(allowed_sets), (vocab + 31) // 32, dtype=torch.int32)
    for j, ids in enumerate(allowed_sets):
        for t in ids:
            word = int(bits[j, t // 32]) & 0xFFFFFFFF | (1 << (t % 32))
            bits[j, t // 32] = word - (1 << 32) if word >= 1 << 31 else word
    return bits


def test_allowed_unpacks_llguidance_layout_and_masks_padding():
    vocab, cols = 70, 80  # the model has 10 padding columns past the tokenizer's ids
    ids = [0, 31, 32, 63, 69]
    mask = TokenMask((0,), _bits([ids], vocab), vocab)
    got = torch.nonzero(mask.allowed(cols)[0]).flatten().tolist()
    assert got == ids
    assert mask.allowed(50).shape == (1, 50)  # fewer columns than ids: cut


def test_mask_validation():
    with pytest.raises(ValueError, match="int32"):
        TokenMask((0,), torch.zeros(1, 3, dtype=torch.int64), 70)
    with pytest.raises(ValueError, match=r"\[1, 3\]"):
        TokenMask((0,), torch.zeros(1, 2, dtype=torch.int32), 70)
    with pytest.raises(ValueError, match="repeat"):
        TokenMask((0, 0), torch.zeros(2, 3, dtype=torch.int32), 70)
    with pytest.raises(ValueError, match="outside"):
        apply_token_mask(torch.zeros(1, 70), TokenMask((1,), _bits([[1]], 70), 70))


def test_masked_tokens_never_sampled_even_with_big_bias():
    vocab, b = 64, 4
    torch.manual_seed(0)
    logits = torch.randn(b, vocab + 6) * 3
    allowed = {1: [5, 6, 7], 3: [40]}
    mask = TokenMask((1, 3), _bits(list(allowed.values()), vocab), vocab)
    params = [SamplingParams(temperature=1.0, logit_bias={0: 100.0, 9: 100.0, 66: 100.0})
              for _ in range(b)]
    seen = {1: set(), 3: set()}
    for _ in range(200):
        out = sample(logits, params, [[1]] * b, [[]] * b, [None] * b, (), mask)
        for r in allowed:
            seen[r].add(int(out.token_ids[r]))
    assert seen[1] <= {5, 6, 7} and len(seen[1]) > 1 and seen[3] == {40}
    # the unconstrained rows follow the bias as usual
    assert int(out.token_ids[0]) in (0, 9, 66)


def test_unconstrained_rows_are_bit_identical_and_logprobs_renormalize():
    vocab, b = 64, 3
    torch.manual_seed(1)
    logits = torch.randn(b, vocab)
    params = [SamplingParams(temperature=0.0, logprobs=3, repetition_penalty=1.3)] * b
    prompts, outs = [[1, 2]] * b, [[3]] * b
    mask = TokenMask((1,), _bits([[2, 10, 11]], vocab), vocab)
    plain = sample(logits, params, prompts, outs, [None] * b)
    masked = sample(logits, params, prompts, outs, [None] * b, (), mask)
    for r in (0, 2):
        assert torch.equal(masked.processed[r], plain.processed[r])
        assert masked.top_logprobs[r] == plain.top_logprobs[r]
        assert int(masked.token_ids[r]) == int(plain.token_ids[r])
    assert int(masked.token_ids[1]) in (2, 10, 11)
    lp = torch.log_softmax(masked.processed[1], dim=-1)
    assert torch.exp(lp).sum().item() == pytest.approx(1.0, abs=1e-5)
    assert masked.top_logprobs[1][0] == sorted((2, 10, 11),
                                               key=lambda t: -float(lp[t]))
    assert not logits.isinf().any()  # the input is never written
