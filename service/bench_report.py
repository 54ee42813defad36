"""The serving benchmark's reports: percentiles, one run's summary and table, and the
per-level medians over interleaved rounds (:func:`combine_rounds`)."""

from __future__ import annotations

import statistics
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from service.bench_client import RequestResult
    from service.bench_serve import BenchConfig


def percentiles(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0}
    s = sorted(xs)

    def pct(p: float) -> float:
        k = (len(s) - 1) * p
        lo, hi = int(k), min(int(k) + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (k - lo)

    return {"mean": statistics.fmean(s), "p50": pct(0.5), "p99": pct(0.99)}


def summarize(cfg: BenchConfig, results: list[RequestResult], duration: float
              ) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    tpot = [(r.latency - r.ttft) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]
    out_tokens = sum(r.output_tokens for r in ok)
    return {
        "config": asdict(cfg) | {"api_key": None},
        "completed": len(ok), "failed": len(results) - len(ok),
        "errors": sorted({r.error for r in results if r.error})[:5],
        "duration_s": duration,
        "request_throughput": len(ok) / duration,
        "output_token_throughput": out_tokens / duration,
        "total_output_tokens": out_tokens,
        "ttft_s": percentiles([r.ttft for r in ok]),
        "tpot_s": percentiles(tpot),
        "itl_s": percentiles([x for r in ok for x in r.itl]),
        "e2el_s": percentiles([r.latency for r in ok]),
    }


def format_table(s: dict[str, Any]) -> str:
    c = s["config"]
    rows = [f"concurrency {c['concurrency']}, {c['num_prompts']} prompts, input "
            f"{c['input_len']}, output {c['output_len']}",
            f"{'completed / failed':<28}{s['completed']} / {s['failed']}",
            f"{'duration (s)':<28}{s['duration_s']:.2f}",
            f"{'request throughput (req/s)':<28}{s['request_throughput']:.3f}",
            f"{'output throughput (tok/s)':<28}{s['output_token_throughput']:.2f}",
            f"{'metric (ms)':<28}{'mean':>10}{'p50':>10}{'p99':>10}"]
    for key, name in (("ttft_s", "TTFT"), ("tpot_s", "TPOT"), ("itl_s", "ITL"),
                      ("e2el_s", "E2EL")):
        v = s[key]
        rows.append(f"{name:<28}{v['mean'] * 1e3:>10.1f}{v['p50'] * 1e3:>10.1f}"
                    f"{v['p99'] * 1e3:>10.1f}")
    rows += [f"error: {e}" for e in s["errors"]]
    return "\n".join(rows)


MEDIAN_KEYS = ("output_token_throughput", "request_throughput", "duration_s")
MEDIAN_PCT_KEYS = ("ttft_s", "tpot_s", "itl_s", "e2el_s")


def combine_rounds(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One summary per concurrency level (in first-seen order) from runs that may repeat
    levels: throughputs, durations and each latency percentile are the medians over that
    level's runs; completed / failed / tokens are summed; ``rounds`` counts the runs and
    ``output_token_throughput_rounds`` lists each run's throughput."""
    levels: dict[int, list[dict[str, Any]]] = {}
    for r in runs:
        levels.setdefault(r["config"]["concurrency"], []).append(r)
    out = []
    for group in levels.values():
        s = {k: v for k, v in group[0].items() if k != "round"}
        for key in MEDIAN_KEYS:
            s[key] = statistics.median(r[key] for r in group)
        for key in MEDIAN_PCT_KEYS:
            s[key] = {p: statistics.median(r[key][p] for r in group) for p in group[0][key]}
        for key in ("completed", "failed", "total_output_tokens"):
            s[key] = sum(r[key] for r in group)
        s["errors"] = sorted({e for r in group for e in r["errors"]})[:5]
        s["rounds"] = len(group)
        s["output_token_throughput_rounds"] = [r["output_token_throughput"] for r in group]
        out.append(s)
    return out
