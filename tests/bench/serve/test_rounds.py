"""bench serve rounds: per-level medians over interleaved rounds (bench/serve/report.py
combine_rounds) and their README table (bench/report/results.py serve_section)."""

from __future__ import annotations

from bench.report.results import serve_section
from bench.serve.report import combine_rounds


def _run(conc: int, tput: float, ttft_p50: float, rnd: int) -> dict:
    pct = {"mean": ttft_p50, "p50": ttft_p50, "p99": 2 * ttft_p50}
    return {"config": {"concurrency": conc, "num_prompts": 4, "input_len": 8,
                       "output_len": 2},
            "completed": 4, "failed": 0, "errors": [], "duration_s": 8 / tput,
            "request_throughput": tput / 2, "output_token_throughput": tput,
            "total_output_tokens": 8, "ttft_s": pct, "tpot_s": pct, "itl_s": pct,
            "e2el_s": pct, "round": rnd}


def test_medians_per_level_in_first_seen_order() -> None:
    runs = [_run(1, 90.0, 0.10, 0), _run(16, 300.0, 0.70, 0),
            _run(1, 100.0, 0.12, 1), _run(16, 360.0, 0.90, 1),
            _run(1, 70.0, 0.20, 2), _run(16, 330.0, 0.80, 2)]
    levels = combine_rounds(runs)
    assert [lv["config"]["concurrency"] for lv in levels] == [1, 16]
    one, sixteen = levels
    assert one["output_token_throughput"] == 90.0 and sixteen["output_token_throughput"] == 330.0
    assert one["ttft_s"]["p50"] == 0.12 and sixteen["ttft_s"]["p99"] == 1.6
    assert one["completed"] == 12 and one["rounds"] == 3
    assert sixteen["output_token_throughput_rounds"] == [300.0, 360.0, 330.0]
    assert runs[0]["output_token_throughput"] == 90.0  # inputs untouched


def test_one_round_is_the_run_itself() -> None:
    run = _run(4, 200.0, 0.3, 0)
    (level,) = combine_rounds([run])
    assert level["output_token_throughput"] == 200.0 and level["rounds"] == 1
    assert level["ttft_s"] == run["ttft_s"]


def test_report_table_uses_the_medians_and_lists_rounds() -> None:
    runs = [_run(1, 90.0, 0.1, 0), _run(16, 300.0, 0.7, 0),
            _run(1, 100.0, 0.1, 1), _run(16, 400.0, 0.7, 1)]
    text = "\n".join(serve_section({"runs": runs, "levels": combine_rounds(runs)}, "demo"))
    assert "median of 2 interleaved rounds" in text
    assert "| 16 | 350.0 | 300.0, 400.0 | 3.68 |" in text  # 350 / 95
    # JSON from a single-round sweep (no "levels") still renders, one row per run
    single = "\n".join(serve_section({"runs": runs[:2]}, "demo"))
    assert "| 16 | 300.0 | 3.33 |" in single
