"""bench serve report math: a stream's usage chunk gives the token counts and is no token
(client.RequestResult.take), hit rates are of summed tokens, rounds combine per
turn, and cache on / off and server / server rows divide the right numbers."""

from __future__ import annotations

import pytest

from bench.serve.client import RequestResult
from bench.serve.comparison import (
    cache_rows,
    format_cache_table,
    format_server_table,
    ratio,
    server_rows,
)
from bench.serve.report import combine_rounds, group_summary, token_counts


def test_usage_chunk_counts_tokens_but_is_no_token_event() -> None:
    r = RequestResult(ok=True, prompt_tokens=7)
    r.take({"choices": [{"index": 0, "text": "ab"}]}, 0.5)
    r.take({"choices": [{"index": 0, "text": "c"}]}, 0.75)
    r.take({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}}, 0.8)
    assert (r.output_tokens, r.ttft, r.itl, r.text) == (2, 0.5, [0.25], "abc")
    assert (r.prompt_tokens, r.cached_tokens) == (9, None)
    r.take({"choices": [], "usage": {"prompt_tokens": 9,
                                     "prompt_tokens_details": {"cached_tokens": 6}}}, 0.9)
    assert (r.output_tokens, r.cached_tokens) == (2, 6)


def test_a_chunk_that_only_finishes_is_no_token_event() -> None:
    """llama-server ends a stream with an empty text, the finish_reason and the usage in
    one chunk; a chunk with an empty text and no finish_reason still is a token (a token
    whose bytes end inside a UTF-8 character)."""
    r = RequestResult(ok=True, prompt_tokens=4)
    r.take({"choices": [{"index": 0, "text": " a", "finish_reason": None}]}, 0.5)
    r.take({"choices": [{"index": 0, "text": "", "finish_reason": None}]}, 0.6)
    r.take({"choices": [{"index": 0, "text": "b", "finish_reason": "length"}]}, 0.7)
    r.take({"choices": [{"index": 0, "text": "", "finish_reason": "length"}],
            "usage": {"prompt_tokens": 4, "completion_tokens": 3}}, 0.9)
    assert (r.events, r.output_tokens, r.text) == (3, 3, " ab")
    assert r.itl == pytest.approx([0.1, 0.1])


def _res(prompt: int, cached: int | None, ttft: float = 0.1, ok: bool = True
         ) -> RequestResult:
    return RequestResult(ok=ok, ttft=ttft, prompt_tokens=prompt, cached_tokens=cached)


def test_hit_rate_is_cached_over_prompt_tokens_of_completed_requests() -> None:
    counts = token_counts([_res(100, 64), _res(50, None), _res(30, 30, ok=False)])
    assert counts == {"prompt_tokens": 150, "cached_tokens": 64, "cached_reported": 1,
                      "hit_rate": pytest.approx(64 / 150)}
    assert token_counts([_res(10, None)])["hit_rate"] == 0.0  # field absent: no hits
    assert token_counts([])["hit_rate"] == 0.0
    g = group_summary("turn 2", [_res(40, 32, 0.2), _res(40, 0, 0.4)])
    assert (g["label"], g["completed"], g["ttft_s"]["p50"]) == ("turn 2", 2, pytest.approx(0.3))
    assert g["hit_rate"] == 0.4


def _pass(mode: str, url: str, tput: float, turn_ttfts: list[float], cached: list[int],
          rnd: int = 0, conc: int = 2, itl_p99: float = 0.1) -> dict:
    def pct(x: float) -> dict:
        return {"mean": x, "p50": x, "p99": x}

    groups = [{"label": f"turn {k + 1}", "completed": 2, "failed": 0, "ttft_s": pct(t),
               "prompt_tokens": 100, "cached_tokens": c, "cached_reported": 2,
               "hit_rate": c / 100} for k, (t, c) in enumerate(zip(turn_ttfts, cached,
                                                                   strict=True))]
    return {"config": {"concurrency": conc, "url": url, "num_prompts": 2, "input_len": 8,
                       "output_len": 4, "workload": "multi-turn"},
            "pass": mode, "round": rnd, "completed": 4, "failed": 0, "errors": [],
            "duration_s": 1.0, "request_throughput": 1.0, "output_token_throughput": tput,
            "total_output_tokens": 16, "ttft_s": pct(0.5), "tpot_s": pct(0.1),
            "itl_s": pct(0.1) | {"p99": itl_p99}, "e2el_s": pct(1.0), "prompt_tokens": 200,
            "cached_tokens": sum(cached), "cached_reported": 4,
            "hit_rate": sum(cached) / 200, "groups": groups}


def test_rounds_combine_per_turn_then_cache_rows_divide_off_by_on() -> None:
    runs = [_pass("cached", "http://a", 10.0, [1.0, 0.2], [0, 80], 0),
            _pass("uncached", "http://a", 12.0, [1.0, 2.0], [0, 0], 0),
            _pass("uncached", "http://a", 8.0, [1.2, 3.0], [0, 0], 1),
            _pass("cached", "http://a", 14.0, [0.8, 0.4], [0, 60], 1)]
    levels = combine_rounds(runs)
    assert [lv["pass"] for lv in levels] == ["cached", "uncached"]
    on = levels[0]
    assert on["rounds"] == 2 and on["output_token_throughput"] == 12.0
    assert on["groups"][1]["ttft_s"]["p50"] == pytest.approx(0.3)
    assert on["groups"][1]["cached_tokens"] == 140 and on["groups"][1]["hit_rate"] == 0.7
    assert on["cached_tokens"] == 140 and on["hit_rate"] == 140 / 400
    rows = cache_rows(levels)
    assert [r["label"] for r in rows] == ["turn 1", "turn 2"]
    assert rows[1]["ttft_p50_on"] == pytest.approx(0.3)
    assert rows[1]["ttft_p50_off"] == pytest.approx(2.5)
    assert rows[1]["ttft_p50_ratio"] == pytest.approx(2.5 / 0.3)
    assert rows[0]["ttft_mean_ratio"] == pytest.approx(1.1 / 0.9)
    assert (rows[1]["hit_rate_on"], rows[1]["hit_rate_off"]) == (0.7, 0.0)
    text = format_cache_table(rows)
    assert "median of 2 rounds" in text and "| turn 2 | 300.0 | 2500.0 | 8.33x |" in text
    assert "70.0% | 0.0% |" in text


def test_server_rows_divide_the_first_servers_throughput_by_the_seconds() -> None:
    runs = [_pass("uncached", "http://a", 30.0, [1.0], [0], itl_p99=0.4),
            _pass("uncached", "http://b", 40.0, [1.0], [0], itl_p99=1.2),
            _pass("uncached", "http://a", 20.0, [1.0], [0], conc=4)]
    rows = server_rows(combine_rounds(runs))
    assert len(rows) == 1  # concurrency 4 ran on one server only
    assert (rows[0]["url"], rows[0]["compare_url"]) == ("http://a", "http://b")
    assert rows[0]["throughput_ratio"] == 0.75
    assert (rows[0]["itl_p99"], rows[0]["itl_p99_compare"]) == (0.4, 1.2)
    assert (rows[0]["itl_p50"], rows[0]["ttft_p99_compare"]) == (0.1, 0.5)
    assert "| 2 | uncached | 30.0 | 40.0 | 0.75x | 500.0 | 500.0 | 400.0 | 1200.0 |" \
        in format_server_table(rows)
    assert cache_rows(combine_rounds(runs)) == []  # no cached pass to pair
    assert ratio(1.0, 0.0) is None and format_server_table([]) == ""
    named = format_server_table(rows, {"http://a": "fp8serve", "http://b": "llama-server"})
    assert named.startswith("server vs server: fp8serve / llama-server\n")


def test_servers_section_gives_each_rounds_ratio_and_what_llama_cpp_ran() -> None:
    from bench.report.results import servers_section

    runs = [_pass("uncached", "http://a", 30.0, [1.0], [0], rnd=0),
            _pass("uncached", "http://b", 20.0, [1.0], [0], rnd=0),
            _pass("uncached", "http://b", 40.0, [1.0], [0], rnd=1),
            _pass("uncached", "http://a", 36.0, [1.0], [0], rnd=1)]
    levels = combine_rounds(runs)
    data = {"levels": levels, "rounds": 2, "comparison": {"servers": server_rows(levels)},
            "servers": {"http://a": {"name": "fp8serve"},
                        "http://b": {"name": "llama-server (w.Q4_1.gguf)",
                                     "llama_cpp": "0.3.36", "built": "-march=native",
                                     "system_info": "CPU : AVX2 = 1", "threads": 2}}}
    text = "\n".join(servers_section(data, "demo"))
    assert "### Serving `demo` against llama-server (w.Q4_1.gguf)" in text
    assert ("| 2 | 33.0 | 30.0 | 1.10 | 1.50, 0.90 | 0.500 / 0.500 | 0.500 / 0.500 | "
            "100.0 / 100.0 | 100.0 / 100.0 | 0 / 0 |") in text
    assert "llama.cpp 0.3.36 built with -march=native, `CPU : AVX2 = 1`; 2 threads" in text
    assert servers_section(data | {"comparison": {"servers": []}}, "demo") == []


def test_servers_section_names_two_fp8serve_servers_by_their_flags() -> None:
    from bench.report.results import servers_section

    runs = [_pass("uncached", "http://a", 30.0, [1.0], [0], itl_p99=0.4),
            _pass("uncached", "http://b", 31.0, [1.0], [0], itl_p99=1.3)]
    levels = combine_rounds(runs)
    flags = ["--max-num-seqs", "2"]
    data = {"levels": levels, "rounds": 1, "comparison": {"servers": server_rows(levels)},
            "servers": {"http://a": {"name": "fp8serve", "model": "/m", "flags": flags},
                        "http://b": {"name": "fp8serve --cap=0", "model": "/m",
                                     "flags": [*flags, "--cap=0"]}}}
    text = "\n".join(servers_section(data, "demo-cap"))
    assert text.startswith("### Serving `demo-cap`: `fp8serve` against `fp8serve --cap=0`")
    assert "| concurrency | fp8serve tok/s | fp8serve --cap=0 tok/s |" in text
    assert "| 400.0 / 1300.0 | 0 / 0 |" in text and "llama.cpp" not in text
    assert "Both on `m`; pairs are `fp8serve` / `fp8serve --cap=0`." in text
    for info in data["servers"].values():
        info["model"] = "/root/.cache/fp8serve/demo-smollm2-135m-fp8"
    text = "\n".join(servers_section(data, "demo-cap"))
    assert "Both on the demo model; pairs are" in text and "/root" not in text
