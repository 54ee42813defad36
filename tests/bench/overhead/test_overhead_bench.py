"""`fp8serve bench overhead` on a tiny checkpoint: the runner, engine and HTTP passes
decode the same greedy tokens (the agreement check holds), and every figure the summary
prints is a same-run ratio (structure only: the timings of a tiny model mean nothing)."""

from __future__ import annotations

import argparse
import json

import pytest

from bench.overhead.cli import format_summary, run
from bench.overhead.run import OverheadBenchConfig


def _args(model, tmp_path, no_http: bool) -> argparse.Namespace:
    return argparse.Namespace(model=model, concurrency=[1, 3], prompt_len=8, gen_len=6,
                              rounds=2, threads=1, no_http=no_http, port=0,
                              json=tmp_path / "overhead.json")


@pytest.mark.parametrize("no_http", [True, False], ids=["engine", "http"])
def test_passes_agree_and_ratios_are_reported(tiny_checkpoint, tmp_path, capsys, no_http):
    model = tiny_checkpoint(vocab_size=131072, tokenizer=True)
    assert run(_args(model, tmp_path, no_http)) == 0
    res = json.loads((tmp_path / "overhead.json").read_text())
    passes = ["runner", "engine"] + ([] if no_http else ["http"])
    for c in ("1", "3"):
        r = res["results"][c]
        assert r["outputs_agree"] is True
        assert list(r["tok_s"]) == passes and all(len(v) == 2 for v in r["tok_s"].values())
        assert r["engine_over_runner"] > 0 and r["engine_cpu_ms_per_step"] >= 0
        assert ("http_over_engine" in r) is not no_http
        assert ("loop_cpu_ms_per_token" in r) is not no_http  # Linux: /proc
    out = capsys.readouterr().out
    assert "engine/runner" in out and "OUTPUTS DIFFER" not in out
    assert format_summary(res).splitlines()[1].startswith("C=1: decode tok/s")


def test_config_checks():
    with pytest.raises(ValueError, match="gen_len"):
        OverheadBenchConfig(model_dir=None, gen_len=1)
    with pytest.raises(ValueError, match="concurrency"):
        OverheadBenchConfig(model_dir=None, concurrency=(0,))
