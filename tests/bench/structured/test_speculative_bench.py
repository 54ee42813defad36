"""`fp8serve bench structured --speculative-config` on a tiny tekken checkpoint, drafting
from the plain pass's output (--spec-oracle right, as the text of random weights means
nothing): outputs identical, the figures are the quotients of what was measured, at most
one mask fill per draft position, the table prints. Never asserts on timings."""

from __future__ import annotations

import argparse
import json

import pytest

from bench.common.errors import BenchError
from bench.structured.cli import run

SPEC = '{"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4}'


def _args(model, out, **kw):
    base = dict(model=model, concurrency=None, gen_len=16, rounds=1, threads=None, json=out,
                speculative_config=SPEC, spec_oracle="right",
                workloads="extraction,tool-args")
    return argparse.Namespace(**(base | kw))


@pytest.fixture(scope="module")
def result(tiny_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "structured-spec.json"
    assert run(_args(tiny_checkpoint(tokenizer="tekken"), out)) == 0
    return json.loads(out.read_text())


def test_rows_are_quotients_of_identical_passes(result, capsys):
    assert [(r["workload"], r["concurrency"]) for r in result["rows"]] == [
        ("extraction", 1), ("tool-args", 1)]
    for r in result["rows"]:
        assert r["outputs_identical"] is True
        assert r["speedup"] == pytest.approx(r["spec_decode_tok_s"] / r["plain_decode_tok_s"])
        assert r["fill_per_step"] == pytest.approx(r["mask_fill_s"] / r["plain_step_s"])
        s = r["spec"]
        assert 0 < s["num_accepted_tokens"] <= s["num_draft_tokens"]
        assert 0 < r["draft_fills_per_draft_token"] <= 1  # <= K fills for K drafts
    tool = result["rows"][1]["spec"]
    assert tool["num_forced_tokens"] > 0  # [TOOL_CALLS]save_quote[ARGS] without a lookup


def test_a_bad_speculative_config_is_refused(tiny_checkpoint, tmp_path):
    bad = _args(tiny_checkpoint(tokenizer="tekken"), tmp_path / "x.json",
                speculative_config='{"method": "ngram", "k": 1}')
    with pytest.raises(BenchError, match="'k'"):
        run(bad)
