"""fp8serve bench attention: the report's structure, both sides computing the same causal
GQA attention (within bf16 rounding), shapes by name or checkpoint, and one-line flag
errors. No timing assertions: the ratios are printed for people."""

from __future__ import annotations

import json

import pytest

from bench.attention.run import AttentionBenchConfig, run_attention_bench, shape_of
from cli.main import main


@pytest.mark.parametrize("shape", [(9, 3, 64), (4, 4, 32)])
def test_both_compute_the_same_attention(shape) -> None:
    # 130 keys: a segment boundary (128) and a partial block
    res = run_attention_bench(AttentionBenchConfig(*shape, lengths=(130,), rounds=2,
                                                   threads=1), log=lambda s: None)
    r = res["lengths"]["130"]
    assert len(r["sdpa_over_ours"]) == 2 and r["sdpa_over_ours_median"] > 0
    assert r["max_rel_diff"] < 0.02  # a wrong mask, scale or head mapping reads ~0.1-1
    assert set(r["gflops_best"]) == {"ours", "sdpa"}


def test_shapes_by_name_and_by_checkpoint(tiny_checkpoint) -> None:
    assert shape_of("smollm2-135m") == (9, 3, 64)
    assert shape_of("ministral-3-3b") == (32, 8, 128)
    assert shape_of(str(tiny_checkpoint())) == (4, 2, 64)


def test_the_command_writes_its_json(tmp_path, capsys) -> None:
    out = tmp_path / "a.json"
    assert main(["bench", "attention", "--lengths", "40", "--rounds", "1", "--threads", "1",
                 "--json", str(out)]) == 0
    assert "sdpa / ours time per round" in capsys.readouterr().out
    assert json.loads(out.read_text())["lengths"]["40"]["max_rel_diff"] < 0.02


@pytest.mark.parametrize("argv, flag", [(["--lengths", "0"], "--lengths"),
                                        (["--lengths", "a"], "--lengths"),
                                        (["--rounds", "0"], "--rounds"),
                                        (["--shape", "no-such-shape"], "--shape")])
def test_bad_flags_are_one_line_errors(argv, flag, capsys) -> None:
    assert main(["bench", "attention", *argv]) != 0
    assert flag in capsys.readouterr().err


def test_config_refuses_heads_that_do_not_group() -> None:
    with pytest.raises(ValueError, match="multiple"):
        AttentionBenchConfig(5, 2, 64)
