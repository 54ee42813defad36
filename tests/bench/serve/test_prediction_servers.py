"""`fp8serve bench serve --prediction --workload code-edit --model-dir DIR`: starts two
fp8serve servers with the same flags, sends both the workload as chat requests, the
first's with the function as their prediction, reports the pair (the first over the
second), stops both; the chat
stream's chunks are read as token events; the checks of what can be combined."""

from __future__ import annotations

import json

import httpx
import pytest

from bench.serve.client import RequestResult
from bench.serve.config import BenchConfig
from bench.serve.passes import plan
from cli.main import main


def test_predicted_and_plain_chat_requests_on_two_servers(tiny_checkpoint, tmp_path, capsys):
    model = tiny_checkpoint(vocab_size=131072, tokenizer=True)
    out = tmp_path / "prediction-serve-x.json"
    rc = main(["bench", "serve", "--prediction", "--workload", "code-edit",
               "--model-dir", str(model), "--server-arg=--max-model-len=1024",
               "--server-arg=--kv-cache-gib=0.05", "--concurrency", "2", "--num-prompts", "2",
               "--output-len", "6", "--json-out", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    (row,) = data["comparison"]["servers"]
    first, second = data["servers"][row["url"]], data["servers"][row["compare_url"]]
    assert first["flags"] == second["flags"]  # the requests differ, not the servers
    assert first["name"] == "fp8serve, chat requests with a prediction"
    assert second["name"] == "fp8serve, chat requests"
    for run in data["runs"]:
        assert (run["completed"], run["failed"], run["total_output_tokens"]) == (2, 0, 12)
        assert run["prompt_tokens"] > 100  # the chat template's prompt, counted by usage
    assert ("server vs server: fp8serve, chat requests with a prediction / fp8serve, chat "
            "requests") in capsys.readouterr().out
    for url in (row["url"], row["compare_url"]):
        with pytest.raises(httpx.HTTPError):
            httpx.get(url + "/health", timeout=2)


def test_chat_chunks_are_token_events_when_they_carry_text():
    res = RequestResult(ok=False)
    chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
              {"choices": [{"index": 0, "delta": {"content": "def"}}]},
              {"choices": [{"index": 0, "delta": {"content": " f"}, "finish_reason": None}]},
              {"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}]},
              {"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 2}}]
    for i, c in enumerate(chunks):
        res.take(c, 0.1 * (i + 1))
    assert res.events == 2 and res.text == "def f"
    assert res.ttft == pytest.approx(0.2) and res.itl == [pytest.approx(0.1)]
    assert (res.prompt_tokens, res.output_tokens) == (9, 2)


def test_per_server_fields_and_their_checks():
    base = BenchConfig("http://a", workload="code-edit")
    steps = plan(base, 1, [1], ["http://a", "http://b"],
                 {"http://a": {"chat": True}, "http://b": {"chat": True, "prediction": "x"}})
    assert [(c.url, c.chat, c.prediction) for _, c, _ in steps] == [
        ("http://a", True, None), ("http://b", True, "x")]
    with pytest.raises(ValueError, match="text workload"):
        BenchConfig("http://a", chat=True)
    with pytest.raises(ValueError, match="chat requests"):
        BenchConfig("http://a", workload="code-edit", prediction="x")


def test_prediction_needs_a_workload_with_text_and_no_other_second_server(capsys):
    assert main(["bench", "serve", "--prediction", "--workload", "story"]) != 0
    assert "no text to predict" in capsys.readouterr().err
    assert main(["bench", "serve", "--prediction", "--compare-url", "http://127.0.0.1:9",
                 "--workload", "code-edit"]) != 0
    assert "--compare-url and --prediction" in capsys.readouterr().err
