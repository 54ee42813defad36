"""SIGTERM with requests that outlast --drain-timeout: each ends as an error of its own
(a stream's error event then ``[DONE]``, a whole answer's JSON error), and the process
exits a few seconds after the drain timeout, not twice it. Before, streams were cut
mid-chunk, whole answers got a plain-text 500, and uvicorn waited the timeout again."""

from __future__ import annotations

import json
import shutil
import signal
import threading
import time
from pathlib import Path

import httpx
import torch
from safetensors.torch import load_file, save_file

from cli.serve_server import END_GRACE_S
from tests.service.serve_process import start_server, stop_server

DRAIN_S = 1.0
LONG = {"model": "tiny", "prompt": "drain me", "max_tokens": 3000, "ignore_eos": True,
        "temperature": 0}


def test_requests_past_the_drain_timeout_end_with_their_own_errors(tiny_checkpoint):
    model = tiny_checkpoint(tokenizer=True)
    srv = start_server(model, "--drain-timeout", str(DRAIN_S), "--max-model-len", "4096",
                       "--served-model-name", "tiny", "--threads", "1")
    try:
        proc, url = srv["proc"], srv["url"]
        whole: dict = {}

        def post_whole() -> None:
            r = httpx.post(url + "/v1/completions", json=LONG, timeout=60)
            whole.update(status=r.status_code, body=r.json())

        t = threading.Thread(target=post_whole)
        with httpx.Client(base_url=url, timeout=60) as hc:
            with hc.stream("POST", "/v1/completions", json={**LONG, "stream": True}) as r:
                lines = r.iter_lines()
                next(lines)
                t.start()
                time.sleep(0.3)  # the whole-answer request is in flight too
                proc.send_signal(signal.SIGTERM)
                sent = time.monotonic()
                rest = [ln for ln in lines if ln.startswith("data: ")]
        t.join(30)
        assert proc.wait(30) == 0
        took = time.monotonic() - sent
    finally:
        stop_server(srv)
    assert rest[-1] == "data: [DONE]"
    err = json.loads(rest[-2][6:])["error"]
    assert "--drain-timeout" in err["message"] and err["code"] == "engine_error", err
    assert whole["status"] == 500, whole
    assert "--drain-timeout" in whole["body"]["error"]["message"]
    assert took < DRAIN_S + END_GRACE_S + 4, took  # was twice the timeout and more


def _never_ending(model: Path, dst: Path) -> Path:
    """A copy of the checkpoint whose lm_head row of EOS (id 2) is zero: its logit is 0,
    below the largest of the other 1023 random logits at every step, so a greedy answer
    runs to its token limit on every host's kernels (Responses has no ignore_eos)."""
    shutil.copytree(model, dst)
    tensors = load_file(dst / "model.safetensors")
    head = tensors["lm_head.weight"]
    head[2] = torch.zeros_like(head[2])
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    return dst


def test_background_responses_past_the_drain_timeout_end_failed(tiny_checkpoint, tmp_path):
    """A background response is a request in flight: the drain lets it run (GET still
    answers, new responses get 503), and one still running at --drain-timeout ends
    ``failed`` naming it; a follower's stream ends with ``response.failed``."""
    model = _never_ending(tiny_checkpoint(tokenizer=True), tmp_path / "ckpt")
    srv = start_server(model, "--drain-timeout", str(DRAIN_S), "--max-model-len", "4096",
                       "--served-model-name", "tiny", "--threads", "1")
    body = {"model": "tiny", "input": "drain me", "max_output_tokens": 3000,
            "temperature": 0, "background": True}
    try:
        proc, url = srv["proc"], srv["url"]
        with httpx.Client(base_url=url, timeout=60) as hc:
            polled = hc.post("/v1/responses", json=body).json()["id"]
            with hc.stream("POST", "/v1/responses", json={**body, "stream": True}) as r:
                lines = r.iter_lines()
                next(lines)
                proc.send_signal(signal.SIGTERM)
                time.sleep(0.3)
                during = hc.get(f"/v1/responses/{polled}").json()["status"]
                refused = hc.post("/v1/responses", json=body).status_code
                events = [json.loads(ln[6:]) for ln in lines if ln.startswith("data: ")]
        assert proc.wait(30) == 0
    finally:
        stop_server(srv)
    assert during == "in_progress" and refused == 503
    last = events[-1]
    assert last["type"] == "response.failed", (last["type"], last["response"].get("usage"))
    assert last["response"]["status"] == "failed"
    assert "--drain-timeout" in last["response"]["error"]["message"]
    # the code a foreground answer ended by the drain has (was the type, server_error)
    assert last["response"]["error"]["code"] == "engine_error"
