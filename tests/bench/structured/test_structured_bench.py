"""`fp8serve bench structured` on a tiny tekken checkpoint: every run is recorded, the
constrained outputs are the schema's JSON, the ratio is the median of the rounds' ratios.
Never asserts on timings (the machine is shared)."""

from __future__ import annotations

import argparse
import json
import statistics

import pytest

from bench.structured.cli import run
from bench.structured.run import StructuredBenchConfig, format_table


@pytest.fixture(scope="module")
def result(tiny_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "structured.json"
    args = argparse.Namespace(model=tiny_checkpoint(tokenizer="tekken"), concurrency="1,3",
                              gen_len=6, rounds=2, threads=None, json=out)
    assert run(args) == 0
    return json.loads(out.read_text())


def test_runs_and_rows(result):
    assert len(result["runs"]) == 2 * 2 * 2  # rounds x concurrencies x modes
    assert [r["concurrency"] for r in result["rows"]] == [1, 3]
    for row in result["rows"]:
        assert row["outputs_valid"] is True
        assert row["ratio"] == pytest.approx(statistics.median(row["round_ratios"]))
        runs = [r for r in result["runs"] if r["concurrency"] == row["concurrency"]]
        free = [r["decode_tok_s"] for r in runs if r["mode"] == "unconstrained"]
        held = [r["decode_tok_s"] for r in runs if r["mode"] == "constrained"]
        want = [c / u for u, c in zip(free, held, strict=True)]
        assert row["round_ratios"] == pytest.approx(want)
        assert 0 <= row["mask_share"] < 1
    assert "ratio" in format_table(result)


@pytest.mark.parametrize("kw", [dict(gen_len=2), dict(rounds=0), dict(concurrency=())])
def test_config_validation(tmp_path, kw):
    with pytest.raises(ValueError):
        StructuredBenchConfig(tmp_path, **kw)
