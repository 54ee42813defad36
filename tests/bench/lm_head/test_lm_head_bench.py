"""`fp8serve bench lm-head` on a tiny checkpoint (random prompts: it has no tokenizer):
every section is there, the figures are consistent with each other, and the helpers
compute what they say. Never asserts on timings."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from bench.lm_head.cli import format_summary, run
from bench.lm_head.logit_compare import agreement, kl_rows


def test_kl_rows_and_agreement():
    a = torch.tensor([[1.0, 2.0, 3.0], [0.0, 0.0, 0.0]])
    assert torch.equal(kl_rows(a, a), torch.zeros(2))
    p, q = torch.tensor([0.5, 0.5]), torch.tensor([0.9, 0.1])
    want = float((p * (p.log() - q.log())).sum())
    assert float(kl_rows(p.log()[None], q.log()[None])[0]) == pytest.approx(want, rel=1e-5)
    assert agreement([1, 2, 3, 4], [1, 2, 9, 4]) == (2, 0.75)


@pytest.fixture(scope="module")
def result(tiny_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "lm-head.json"
    args = argparse.Namespace(model=tiny_checkpoint(tie_word_embeddings=True), prompts=2,
                              random_prompts=True, kl_tokens=4, greedy_tokens=6,
                              speed_rounds=2, speed_tokens=3, threads=1, json=out)
    assert run(args) == 0
    return json.loads(out.read_text())


def test_sections_and_consistency(result):
    acc, sp = result["accuracy"], result["speed"]
    lg = acc["logits"]
    assert lg["rows"] == 2 * (32 + 4)  # every position of prompt + continuation
    assert 0 <= lg["kl_mean"] <= lg["kl_p99"] <= lg["kl_max"] and 0 <= lg["top1"] <= 1
    assert len(acc["greedy"]) == 2 and all(0 <= g["leading_agree"] <= 6 for g in acc["greedy"])
    ratios = [f / b for f, b in zip(sp["decode_tok_s"]["fp8"], sp["decode_tok_s"]["bf16"],
                                    strict=True)]
    assert sp["decode_ratio_fp8_over_bf16"] == pytest.approx(ratios)
    assert result["fp8_head_kernel"] and result["head_bytes"]["fp8"] < result["head_bytes"]["bf16"]
    assert "KL(bf16 || fp8)" in format_summary(result)
