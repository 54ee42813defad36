"""The earlier runs' charts (bench/report/earlier_runs.py) draw the figures that
docs/performance.md's transcribed tables hold: each value is checked against the table."""

from __future__ import annotations

import statistics
from pathlib import Path

from bench.report.earlier_runs import AVX2_DECODE, AVX512_DECODE, AVX512_KERNELS

DOC = Path(__file__).resolve().parents[3] / "docs" / "performance.md"


def rows(prefix: str) -> list[list[str]]:
    """Table rows starting with prefix in the AVX2 and AVX-512 sections (the AMX
    section's recorded tables share their columns)."""
    text = DOC.read_text()
    text = text[text.index("## AVX2 hosts"):text.index("## AMX hosts")]
    return [[c.strip() for c in line.strip("|").split("|")]
            for line in text.splitlines() if line.startswith(prefix)]


def test_kernel_ratios_are_the_tables() -> None:
    table = {(r[0].split(" (")[0], int(r[1])): float(r[4])
             for r in rows("| ") if len(r) == 6 and r[2] == "avx512_w8a16"}
    assert len(table) == 20
    assert {(s, m): v for s, m, v in AVX512_KERNELS} == table


def test_decode_figures_are_the_tables() -> None:
    demo = rows("| demo-smollm2-135m-fp8 (30 layers) | 143.9 |")[0]
    run = AVX512_DECODE[0]
    assert run["fp8serve"]["decode_tok_s"] == 143.9
    assert demo[2].startswith(f"{143.9 / run['baselines']['llamacpp_q4_1']['decode_tok_s']:.2f}")
    assert demo[3].startswith(f"{143.9 / run['baselines']['transformers']['decode_tok_s']:.2f}")
    assert demo[4] == f"0.68 of {run['bandwidth_bound']['decode_tok_s']:.1f} tok/s"
    q8 = [r for r in rows("| ") if len(r) == 7 and r[2].count(",") == 2 and "shape" in r[0]
          and "lm-head" not in r[1]]
    medians = [(statistics.median(map(float, r[2].split(","))),
                statistics.median(map(float, r[3].split(",")))) for r in q8]
    for run in AVX2_DECODE:
        pair = (run["fp8serve"]["decode_tok_s"],
                run["baselines"]["llamacpp_q8_0"]["decode_tok_s"])
        assert pair in medians, pair
