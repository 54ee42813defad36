"""`fp8serve bench serve --speculative-config ... --model-dir DIR`: starts a speculative and
a plain server on the checkpoint, drives both with a text workload, reports the pair, and
stops them (their ports close)."""

from __future__ import annotations

import json

import httpx
import pytest

from cli.main import main


def test_starts_both_servers_drives_them_and_stops_them(tiny_checkpoint, tmp_path, capsys):
    model = tiny_checkpoint(vocab_size=131072, tokenizer=True)
    out = tmp_path / "spec.json"
    rc = main(["bench", "serve", "--speculative-config",
               '{"method": "ngram", "num_speculative_tokens": 2}', "--model-dir", str(model),
               "--server-arg=--max-model-len=512", "--server-arg=--kv-cache-gib=0.05",
               "--workload", "story", "--concurrency", "2", "--num-prompts", "2",
               "--output-len", "6", "--json-out", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    urls = sorted({r["config"]["url"] for r in data["runs"]})
    assert len(urls) == 2
    for run in data["runs"]:
        assert (run["completed"], run["failed"], run["total_output_tokens"]) == (2, 0, 12)
    (row,) = data["comparison"]["servers"]
    text = capsys.readouterr().out
    assert f"started {row['url']} (speculative" in text
    assert f"started {row['compare_url']} (plain" in text
    for url in urls:
        with pytest.raises(httpx.HTTPError):
            httpx.get(url + "/health", timeout=2)
