"""bench serve passes (bench/serve/passes.py) against an in-process fake server that
records every request and plays a prefix cache keyed by cache_salt: what each turn sends,
which salts travel, and that the reported hit rate is the responses' cached tokens."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from typing import Any

from aiohttp import web

from bench.serve.config import BenchConfig
from bench.serve.passes import run_pass
from bench.serve.workloads import CACHED, UNCACHED, conversations

BLOCK = 16


class FakeServer:
    """Replies with one letter per token; /tokenize maps each character to its code point.
    With ``report_cached``, usage carries the longest whole-block prefix an earlier
    request with the same salt had (a prefix cache that honours cache_salt)."""

    def __init__(self, report_cached: bool) -> None:
        self.report_cached = report_cached
        self.bodies: list[dict[str, Any]] = []

    def cached(self, body: dict[str, Any]) -> int:
        best = 0
        for old in self.bodies[:-1]:
            if old.get("cache_salt") != body.get("cache_salt"):
                continue
            n = 0
            for a, b in zip(old["prompt"], body["prompt"], strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n // BLOCK * BLOCK)
        return best

    async def completions(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.bodies.append(body)
        resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await resp.prepare(request)
        for i in range(body["max_tokens"]):
            text = chr(ord("a") + (len(body["prompt"]) + i) % 26)
            await resp.write(f"data: {json.dumps({'choices': [{'text': text}]})}\n\n".encode())
        usage: dict[str, Any] = {"prompt_tokens": len(body["prompt"])}
        if self.report_cached:
            usage["prompt_tokens_details"] = {"cached_tokens": self.cached(body)}
        await resp.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
        await resp.write(b"data: [DONE]\n\n")
        return resp

    async def tokenize(self, request: web.Request) -> web.Response:
        return web.json_response({"tokens": [ord(c) for c in (await request.json())["prompt"]]})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "fake"}]})


def drive(fake: FakeServer, cfg: BenchConfig, modes: list[str]) -> list[dict[str, Any]]:
    async def main() -> list[dict[str, Any]]:
        app = web.Application()
        app.router.add_post("/v1/completions", fake.completions)
        app.router.add_post("/tokenize", fake.tokenize)
        app.router.add_get("/v1/models", fake.models)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        url = f"http://127.0.0.1:{port}"
        try:
            return [await run_pass(dataclasses.replace(cfg, url=url), m)
                    for m in modes]
        finally:
            await runner.cleanup()

    return asyncio.run(main())


def test_multi_turn_resends_the_history_and_salts_per_pass() -> None:
    cfg = BenchConfig("x", concurrency=2, num_prompts=3, input_len=5, output_len=4,
                      workload="multi-turn", system_len=40, turns=3)
    fake = FakeServer(report_cached=True)
    on, off = drive(fake, cfg, [CACHED, UNCACHED])
    sent_on, sent_off = fake.bodies[:9], fake.bodies[9:]
    convs = conversations(3, 3, 40, 5, cfg.vocab_lo, cfg.vocab_hi, cfg.seed)
    for sent in (sent_on, sent_off):
        for system, users in convs:
            mine = [b["prompt"] for b in sent if b["prompt"][:40] == system]
            assert mine[0] == system + users[0] and len(mine) == 3
            for k in (1, 2):  # the reply comes back as /tokenize made it: code points
                reply = [ord(chr(ord("a") + (len(mine[k - 1]) + i) % 26)) for i in range(4)]
                assert mine[k] == mine[k - 1] + reply + users[k]
    assert len({b["cache_salt"] for b in sent_on}) == 1
    assert len({b["cache_salt"] for b in sent_off}) == 9
    assert not {b["cache_salt"] for b in sent_on} & {b["cache_salt"] for b in sent_off}
    assert [g["label"] for g in on["groups"]] == ["turn 1", "turn 2", "turn 3"]
    assert [g["prompt_tokens"] for g in on["groups"]] == [135, 162, 189]
    assert on["groups"][0]["cached_tokens"] == 0 and on["groups"][2]["hit_rate"] > 0.5
    assert off["cached_tokens"] == 0 and off["hit_rate"] == 0.0
    assert on["hit_rate"] == on["cached_tokens"] / on["prompt_tokens"]
    assert on["completed"] == 9 and on["total_output_tokens"] == 36  # usage is no token
    assert on["cached_reported"] == 9


def test_shared_prefix_warms_with_one_request_then_runs_the_rest() -> None:
    cfg = BenchConfig("x", concurrency=2, num_prompts=4, input_len=3, output_len=2,
                      workload="shared-prefix", system_len=32)
    fake = FakeServer(report_cached=True)
    (on,) = drive(fake, cfg, [CACHED])
    first, rest = on["groups"]
    assert (first["label"], first["completed"], first["cached_tokens"]) == ("first", 1, 0)
    assert (rest["completed"], rest["prompt_tokens"], rest["cached_tokens"]) == (3, 105, 96)
    assert on["completed"] == 3 and on["hit_rate"] == 96 / 105  # the rest only
    assert len({tuple(b["prompt"][:32]) for b in fake.bodies}) == 1


def test_absent_cached_tokens_read_as_no_hits() -> None:
    cfg = BenchConfig("x", num_prompts=2, input_len=4, output_len=2,
                      workload="shared-prefix", system_len=32)
    (off,) = drive(FakeServer(report_cached=False), cfg, [UNCACHED])
    assert off["cached_reported"] == 0 and off["cached_tokens"] == 0
    assert off["hit_rate"] == 0.0 and off["prompt_tokens"] == 36
