"""`fp8serve bench serve --compare-server-arg FLAG --model-dir DIR`: starts fp8serve twice
on the checkpoint, the second with FLAG added, drives both, reports the pair with their
flags, and stops them (their ports close). Giving two ways to name the second server is an
error that names both."""

from __future__ import annotations

import json

import httpx
import pytest

from cli.main import main


def test_starts_both_servers_with_their_flags_drives_them_and_stops_them(
        tiny_checkpoint, tmp_path, capsys):
    model = tiny_checkpoint(vocab_size=131072, tokenizer=True)
    out = tmp_path / "flags-serve-x.json"
    rc = main(["bench", "serve", "--model-dir", str(model),
               "--server-arg=--max-model-len=512", "--server-arg=--kv-cache-gib=0.05",
               "--compare-server-arg=--max-prefill-tokens-with-decodes=128",
               "--concurrency", "2", "--num-prompts", "2", "--input-len", "16",
               "--output-len", "6", "--json-out", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    (row,) = data["comparison"]["servers"]
    first, second = data["servers"][row["url"]], data["servers"][row["compare_url"]]
    assert first["flags"] == ["--max-num-seqs", "2", "--max-model-len=512",
                              "--kv-cache-gib=0.05"]
    assert second["flags"] == first["flags"] + ["--max-prefill-tokens-with-decodes=128"]
    assert second["name"] == ("fp8serve --max-model-len=512 --kv-cache-gib=0.05 "
                              "--max-prefill-tokens-with-decodes=128")
    for run in data["runs"]:
        assert (run["completed"], run["failed"], run["total_output_tokens"]) == (2, 0, 12)
    text = capsys.readouterr().out
    assert f"started {row['compare_url']} ({second['name']}" in text
    assert f"server vs server: {first['name']} / {second['name']}" in text
    for url in (row["url"], row["compare_url"]):
        with pytest.raises(httpx.HTTPError):
            httpx.get(url + "/health", timeout=2)


def test_one_second_server_at_a_time(capsys):
    rc = main(["bench", "serve", "--compare-url", "http://127.0.0.1:9",
               "--compare-server-arg=--threads=1"])
    assert rc != 0
    assert ("--compare-url and --compare-server-arg: each names the second server"
            in capsys.readouterr().err)
