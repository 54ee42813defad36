"""The serving benchmark's reports: percentiles, one run's summary and table, and the
per-level medians over interleaved rounds (:func:`combine_rounds`).

Hit rate: cached prompt tokens / prompt tokens, summed over a run's completed requests,
from each response's ``usage.prompt_tokens_details.cached_tokens`` (0 where absent);
``cached_reported`` counts the requests whose usage carried the field."""

from __future__ import annotations

import statistics
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from bench.serve.client import RequestResult
    from bench.serve.config import BenchConfig


def percentiles(xs: list[float]) -> dict[str, float]:
    if not xs:
        return {"mean": 0.0, "p50": 0.0, "p99": 0.0}
    s = sorted(xs)

    def pct(p: float) -> float:
        k = (len(s) - 1) * p
        lo, hi = int(k), min(int(k) + 1, len(s) - 1)
        return s[lo] + (s[hi] - s[lo]) * (k - lo)

    return {"mean": statistics.fmean(s), "p50": pct(0.5), "p99": pct(0.99)}


def hit_rate(cached_tokens: int, prompt_tokens: int) -> float:
    return cached_tokens / prompt_tokens if prompt_tokens > 0 else 0.0


def token_counts(results: list[RequestResult]) -> dict[str, Any]:
    """Prompt and cached tokens of the completed requests, and their hit rate."""
    ok = [r for r in results if r.ok]
    prompt = sum(r.prompt_tokens for r in ok)
    cached = sum(r.cached_tokens or 0 for r in ok)
    return {"prompt_tokens": prompt, "cached_tokens": cached,
            "cached_reported": sum(r.cached_tokens is not None for r in ok),
            "hit_rate": hit_rate(cached, prompt)}


def group_summary(label: str, results: list[RequestResult]) -> dict[str, Any]:
    """TTFT and tokens of one slice of a run (a turn index, the first request, ...)."""
    ok = [r for r in results if r.ok]
    return ({"label": label, "completed": len(ok), "failed": len(results) - len(ok),
             "ttft_s": percentiles([r.ttft for r in ok])} | token_counts(results))


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
    } | token_counts(results)


def workload_line(s: dict[str, Any]) -> str:
    """The run's shape in words (the workload and pass unless random)."""
    c = s["config"]
    what = {"multi-turn": f"multi-turn ({c.get('turns')} turns, system {c.get('system_len')}), ",
            "shared-prefix": f"shared-prefix (system {c.get('system_len')}), "
            }.get(c.get("workload", "random"), "")
    units = "conversations" if c.get("workload") == "multi-turn" else "prompts"
    line = (f"{what}concurrency {c['concurrency']}, {c['num_prompts']} {units}, input "
            f"{c['input_len']}, output {c['output_len']}")
    if s.get("pass") and c.get("workload", "random") != "random":
        line += f", {s['pass']} pass"
    return line


def format_table(s: dict[str, Any]) -> str:
    rows = [workload_line(s),
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
    for g in s.get("groups", []):
        rows.append(f"{'TTFT ' + g['label']:<28}{g['ttft_s']['mean'] * 1e3:>10.1f}"
                    f"{g['ttft_s']['p50'] * 1e3:>10.1f}{g['ttft_s']['p99'] * 1e3:>10.1f}")
    if "hit_rate" in s:
        rows.append(f"{'prefix cache hit rate':<28}{s['hit_rate']:.1%} "
                    f"({s['cached_tokens']} of {s['prompt_tokens']} prompt tokens)")
    rows += [f"error: {e}" for e in s["errors"]]
    return "\n".join(rows)


MEDIAN_KEYS = ("output_token_throughput", "request_throughput", "duration_s")
MEDIAN_PCT_KEYS = ("ttft_s", "tpot_s", "itl_s", "e2el_s")
SUM_KEYS = ("completed", "failed", "total_output_tokens", "prompt_tokens", "cached_tokens",
            "cached_reported")


def run_key(run: dict[str, Any]) -> tuple[int, str | None, str | None]:
    """What rounds repeat: the concurrency level, the server and the pass."""
    c = run["config"]
    return c["concurrency"], c.get("url"), run.get("pass")


def _medians(group: list[dict[str, Any]], key: str) -> dict[str, float]:
    return {p: statistics.median(r[key][p] for r in group) for p in group[0][key]}


def _combine_counts(s: dict[str, Any], group: list[dict[str, Any]]) -> None:
    for key in SUM_KEYS:
        if any(key in r for r in group):
            s[key] = sum(r.get(key, 0) for r in group)
    if "prompt_tokens" in s:
        s["hit_rate"] = hit_rate(s["cached_tokens"], s["prompt_tokens"])


def combine_groups(per_round: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Each slice (group_summary) over the rounds: TTFT medians, tokens summed."""
    out = []
    for same in zip(*per_round, strict=True):
        g = dict(same[0]) | {"ttft_s": _medians(list(same), "ttft_s")}
        _combine_counts(g, list(same))
        out.append(g)
    return out


def combine_rounds(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One summary per concurrency level, server and pass (in first-seen order) from runs
    that may repeat them: throughputs, durations and each latency percentile are the
    medians over the runs; completed / failed / tokens are summed (the hit rate is of the
    sums); ``rounds`` counts the runs and ``output_token_throughput_rounds`` lists each
    run's throughput; ``groups`` (per-turn or first / rest slices) combine alike."""
    levels: dict[tuple[int, str | None, str | None], list[dict[str, Any]]] = {}
    for r in runs:
        levels.setdefault(run_key(r), []).append(r)
    out = []
    for group in levels.values():
        s = {k: v for k, v in group[0].items() if k != "round"}
        for key in MEDIAN_KEYS:
            s[key] = statistics.median(r[key] for r in group)
        for key in MEDIAN_PCT_KEYS:
            s[key] = _medians(group, key)
        _combine_counts(s, group)
        if "groups" in s:
            s["groups"] = combine_groups([r["groups"] for r in group])
        s["errors"] = sorted({e for r in group for e in r["errors"]})[:5]
        s["rounds"] = len(group)
        s["output_token_throughput_rounds"] = [r["output_token_throughput"] for r in group]
        out.append(s)
    return out
