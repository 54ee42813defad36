"""The serving benchmark's comparisons, from combined levels (report.combine_rounds):
cache on vs off (the cached and uncached passes of one server: TTFT per turn or per slice,
the ratio off / on, the hit rates) and server vs server (``--compare-url``: throughput,
TTFT and ITL of each pass on both). Tables are markdown, ready for the README."""

from __future__ import annotations

from typing import Any

from bench.serve.workloads import CACHED, UNCACHED


def ratio(num: float, den: float) -> float | None:
    return num / den if den > 0 else None


def _pairs(levels: list[dict[str, Any]], key: str) -> list[tuple[dict, dict]]:
    """Levels matched on everything of run_key but ``key`` ("pass" or "url"), in order:
    (the first value's level, the second's)."""
    seen: dict[tuple, list[dict]] = {}
    for lv in levels:
        c = lv["config"]
        ident = (c["concurrency"], lv.get("pass") if key == "url" else c["url"])
        seen.setdefault(ident, []).append(lv)
    return [(g[0], g[1]) for g in seen.values() if len(g) == 2]


def cache_rows(levels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per slice (turn, first / rest) of each server and concurrency level that
    ran both passes: TTFT p50 / mean with the cache on and off, off / on, hit rates."""
    rows = []
    for a, b in _pairs(levels, "pass"):
        on, off = (a, b) if a.get("pass") == CACHED else (b, a)
        if (on.get("pass"), off.get("pass")) != (CACHED, UNCACHED):
            continue
        for g_on, g_off in zip(on.get("groups", []), off.get("groups", []), strict=True):
            row = {"concurrency": on["config"]["concurrency"], "url": on["config"]["url"],
                   "label": g_on["label"], "rounds": on.get("rounds", 1)}
            for stat in ("p50", "mean"):
                row[f"ttft_{stat}_on"] = g_on["ttft_s"][stat]
                row[f"ttft_{stat}_off"] = g_off["ttft_s"][stat]
                row[f"ttft_{stat}_ratio"] = ratio(g_off["ttft_s"][stat], g_on["ttft_s"][stat])
            row["hit_rate_on"], row["hit_rate_off"] = g_on["hit_rate"], g_off["hit_rate"]
            row["throughput_on"] = on["output_token_throughput"]
            row["throughput_off"] = off["output_token_throughput"]
            rows.append(row)
    return rows


def server_rows(levels: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per pass and concurrency level run on two servers: output throughput, TTFT
    and ITL p50 / p99 on each, and the first server's throughput / the second's."""
    rows = []
    for a, b in _pairs(levels, "url"):
        rows.append({"concurrency": a["config"]["concurrency"], "pass": a.get("pass"),
                     "url": a["config"]["url"], "compare_url": b["config"]["url"],
                     "throughput": a["output_token_throughput"],
                     "throughput_compare": b["output_token_throughput"],
                     "throughput_ratio": ratio(a["output_token_throughput"],
                                               b["output_token_throughput"]),
                     **{f"{m}_{q}{side}": lv[f"{m}_s"][q]
                        for m in ("ttft", "itl") for q in ("p50", "p99")
                        for side, lv in (("", a), ("_compare", b))},
                     "hit_rate": a.get("hit_rate", 0.0),
                     "hit_rate_compare": b.get("hit_rate", 0.0),
                     "rounds": a.get("rounds", 1)})
    return rows


def _x(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}x"


def format_cache_table(rows: list[dict[str, Any]]) -> str:
    """Markdown: one table per server and concurrency level."""
    blocks: dict[tuple[int, str], list[dict[str, Any]]] = {}
    for r in rows:
        blocks.setdefault((r["concurrency"], r["url"]), []).append(r)
    lines: list[str] = []
    for (conc, url), block in blocks.items():
        b = block[0]
        how = f", median of {b['rounds']} rounds" if b["rounds"] > 1 else ""
        lines += ["" if lines else None,
                  f"cache on vs off: concurrency {conc}, {url}{how}; output throughput "
                  f"{b['throughput_on']:.1f} tok/s on, {b['throughput_off']:.1f} off",
                  "| | TTFT p50 on (ms) | off (ms) | off / on | TTFT mean on (ms) "
                  "| off (ms) | off / on | hit rate on | off |",
                  "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {r['label']} | {r['ttft_p50_on'] * 1e3:.1f} | "
                  f"{r['ttft_p50_off'] * 1e3:.1f} | {_x(r['ttft_p50_ratio'])} | "
                  f"{r['ttft_mean_on'] * 1e3:.1f} | {r['ttft_mean_off'] * 1e3:.1f} | "
                  f"{_x(r['ttft_mean_ratio'])} | {r['hit_rate_on']:.1%} | "
                  f"{r['hit_rate_off']:.1%} |" for r in block]
    return "\n".join(x for x in lines if x is not None)


def format_server_table(rows: list[dict[str, Any]], names: dict[str, str] | None = None
                        ) -> str:
    """Markdown; ``names``: what to call a server instead of its URL."""
    if not rows:
        return ""
    r0, names = rows[0], names or {}
    first, second = (names.get(r0[k], r0[k]) for k in ("url", "compare_url"))
    lines = [f"server vs server: {first} / {second}",
             "| concurrency | pass | output tok/s | compare tok/s | ratio | TTFT p50 (ms) "
             "| compare (ms) | ITL p99 (ms) | compare (ms) | hit rate | compare |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['concurrency']} | {r['pass']} | {r['throughput']:.1f} | "
                     f"{r['throughput_compare']:.1f} | {_x(r['throughput_ratio'])} | "
                     f"{r['ttft_p50'] * 1e3:.1f} | {r['ttft_p50_compare'] * 1e3:.1f} | "
                     f"{r['itl_p99'] * 1e3:.1f} | {r['itl_p99_compare'] * 1e3:.1f} | "
                     f"{r['hit_rate']:.1%} | {r['hit_rate_compare']:.1%} |")
    return "\n".join(lines)
