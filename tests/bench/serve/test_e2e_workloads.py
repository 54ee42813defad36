"""End to end: `fp8serve bench serve --workload multi-turn | shared-prefix` and
`--compare-url` against a real server (the fixture of test_e2e_server.py, its own instance
for this module). Whether that server has a prefix cache or not, the passes complete, the
tables print, the prompt token counts are the workload's, and the hit rate is the cached
tokens the responses reported. The server caches prefixes (its default), so the cached
passes must find tokens in the cache and the uncached ones (a salt per request) none."""

from __future__ import annotations

import json

from cli.main import main
from tests.service.test_e2e_server import KEY, server  # noqa: F401 (the fixture)


def check_tokens(summary: dict) -> None:
    """The hit rate is what the responses said, whatever the server caches."""
    assert 0 <= summary["cached_tokens"] <= summary["prompt_tokens"]
    assert summary["hit_rate"] == summary["cached_tokens"] / summary["prompt_tokens"]
    if summary["cached_reported"] == 0:
        assert summary["cached_tokens"] == 0 and summary["hit_rate"] == 0.0


def test_multi_turn_cache_on_and_off(server, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "mt.json"
    rc = main(["bench", "serve", "--url", server["url"], "--api-key", KEY,
               "--workload", "multi-turn", "--concurrency", "2", "--num-prompts", "2",
               "--turns", "3", "--system-len", "40", "--input-len", "8", "--output-len", "4",
               "--json-out", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert [(r["round"], r["pass"]) for r in data["runs"]] == [(0, "cached"), (0, "uncached")]
    for run in data["runs"]:
        assert (run["completed"], run["failed"], run["total_output_tokens"]) == (6, 0, 24)
        turns = run["groups"]
        assert [g["label"] for g in turns] == ["turn 1", "turn 2", "turn 3"]
        assert turns[0]["prompt_tokens"] == 2 * 48  # system + first user message, exact
        for prev, nxt in zip(turns, turns[1:], strict=False):
            assert nxt["prompt_tokens"] >= prev["prompt_tokens"] + 2 * 8  # + reply
        assert sum(g["cached_tokens"] for g in turns) == run["cached_tokens"]
        check_tokens(run)
        assert turns[0]["cached_tokens"] == 0  # every conversation has its own system prompt
        if run["pass"] == "cached":
            assert all(g["cached_tokens"] >= 2 * 48 // 16 * 16 for g in turns[1:])
        else:
            assert run["cached_tokens"] == 0
    rows = data["comparison"]["cache"]
    assert [r["label"] for r in rows] == ["turn 1", "turn 2", "turn 3"]
    assert all(r["ttft_p50_ratio"] > 0 for r in rows)
    text = capsys.readouterr().out
    assert "cache on vs off: concurrency 2" in text and "| turn 3 |" in text


def test_shared_prefix_cache_on_and_off(server, tmp_path, capsys):  # noqa: F811
    out = tmp_path / "sp.json"
    rc = main(["bench", "serve", "--url", server["url"], "--api-key", KEY,
               "--workload", "shared-prefix", "--concurrency", "2", "--num-prompts", "3",
               "--system-len", "64", "--input-len", "8", "--output-len", "3", "--rounds", "2",
               "--json-out", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert [(r["round"], r["pass"]) for r in data["runs"]] == [
        (0, "cached"), (0, "uncached"), (1, "uncached"), (1, "cached")]
    for run in data["runs"]:
        first, rest = run["groups"]
        assert (first["completed"], first["prompt_tokens"]) == (1, 72)
        assert (rest["completed"], rest["prompt_tokens"]) == (2, 144)
        assert run["prompt_tokens"] == 144  # the pass's numbers are the rest's
        check_tokens(run)
        assert run["cached_tokens"] == (2 * 64 if run["pass"] == "cached" else 0)
    assert [lv["rounds"] for lv in data["levels"]] == [2, 2]
    assert [r["label"] for r in data["comparison"]["cache"]] == ["first", "rest"]
    assert "median of 2 rounds" in capsys.readouterr().out


def test_random_workload_against_a_compare_server(server, tmp_path, capsys):  # noqa: F811
    other = server["url"] + "/"  # the same server under a second name
    out = tmp_path / "cmp.json"
    rc = main(["bench", "serve", "--url", server["url"], "--compare-url", other,
               "--api-key", KEY, "--num-prompts", "2", "--input-len", "8",
               "--output-len", "3", "--rounds", "2", "--json-out", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert [r["config"]["url"] for r in data["runs"]] == [server["url"], other, other,
                                                          server["url"]]
    (row,) = data["comparison"]["servers"]
    assert (row["url"], row["compare_url"], row["pass"]) == (server["url"], other, "uncached")
    assert row["throughput_ratio"] == row["throughput"] / row["throughput_compare"]
    for run in data["runs"]:
        check_tokens(run)
    assert "server vs server" in capsys.readouterr().out
