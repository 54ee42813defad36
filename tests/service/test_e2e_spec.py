"""Speculative decoding end to end: two real servers on the demo model, one with
--speculative-config (n-gram), one without. Greedy answers (text, token logprobs and top
logprobs, which are the logits' own bits, finish reasons, usage) must be identical, one
request at a time and 16 at once, with stop strings, penalties and streaming; seeded
sampling too; the spec_decode metrics count what was drafted and accepted."""

from __future__ import annotations

import asyncio
import json
import re

import httpx
import pytest

from tests.service.conftest import SPEC

PASSAGE = ("The committee met on Tuesday to review the budget. It approved the new library, "
           "delayed the bridge repairs until spring, and asked the mayor to publish the "
           "costs of the festival before the next meeting.")
FUNC = ("def area(width, height):\n    \"\"\"Return the area of a rectangle.\"\"\"\n"
        "    if width < 0 or height < 0:\n        raise ValueError(\"negative side\")\n"
        "    return width * height\n")
PROMPTS = [
    f"Text: {PASSAGE}\n\nCopy the text exactly.\nCopy: {PASSAGE[:40]}",
    f"{FUNC}\n# The same function, renamed to rect_area:\ndef rect_area(width, height):\n",
    f"Summary of the meeting. {PASSAGE} In short, the committee",
    "Once upon a time, in a village by the sea,",
]


@pytest.fixture(scope="module")
def servers(spec_servers):
    return spec_servers  # shared with test_e2e_spec_grammar.py (tests/service/conftest.py)


def complete(srv: dict, prompt: str, **kw) -> dict:
    body = {"model": "demo", "prompt": prompt, "max_tokens": 32, "temperature": 0,
            "logprobs": 3, **kw}
    r = httpx.post(srv["url"] + "/v1/completions", json=body, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def answer(body: dict) -> list:
    return [(c["text"], c["logprobs"], c["finish_reason"]) for c in body["choices"]] + [
        {k: v for k, v in body["usage"].items() if k != "prompt_tokens_details"}]


def metric(srv: dict, name: str) -> float:
    text = httpx.get(srv["url"] + "/metrics").text
    found = re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert found, f"{name} not in /metrics"
    return sum(map(float, found))


def test_version_names_the_config(servers):
    on, off = servers
    assert httpx.get(on["url"] + "/version").json()["speculative_config"] == SPEC
    assert httpx.get(off["url"] + "/version").json()["speculative_config"] is None


def test_greedy_one_at_a_time_equals_plain(servers):
    on, off = servers
    accepted0 = metric(on, "fp8serve_spec_decode_num_accepted_tokens_total")
    off_drafts0 = metric(off, "fp8serve_spec_decode_num_drafts_total")  # predictions draft
    for i, prompt in enumerate(PROMPTS):
        extra = [{}, {"stop": [" meeting"]}, {"frequency_penalty": 0.5,
                                              "presence_penalty": 0.3},
                 {"repetition_penalty": 1.2, "stop": ["\n\n"]}][i]
        want = answer(complete(off, prompt, **extra))
        assert answer(complete(on, prompt, **extra)) == want, prompt
    assert metric(on, "fp8serve_spec_decode_num_accepted_tokens_total") > accepted0
    assert metric(off, "fp8serve_spec_decode_num_drafts_total") == off_drafts0
    drafts = metric(on, "fp8serve_spec_decode_num_drafts_total")
    per_pos = metric(on, "fp8serve_spec_decode_num_accepted_tokens_per_pos_total")
    assert drafts > 0 and per_pos == metric(
        on, "fp8serve_spec_decode_num_accepted_tokens_total")


async def _stream(client: httpx.AsyncClient, prompt: str, **kw) -> tuple[list, list[int]]:
    """(the tokens with their logprobs, tokens per chunk)."""
    body = {"model": "demo", "prompt": prompt, "max_tokens": 24, "temperature": 0,
            "stream": True, "logprobs": 2, **kw}
    got, sizes = [], []
    async with client.stream("POST", "/v1/completions", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: {"):
                lp = json.loads(line[6:])["choices"][0]["logprobs"]
                if lp and lp["tokens"]:
                    got += list(zip(lp["tokens"], lp["token_logprobs"], lp["top_logprobs"],
                                    strict=True))
                    sizes.append(len(lp["tokens"]))
    return got, sizes


def test_sixteen_streams_at_once_equal_plain_and_send_several_tokens_per_chunk(servers):
    on, off = servers
    jobs = [(PROMPTS[i % 4] + " " * (i // 4), {"stop": ["library"]} if i % 5 == 0 else {})
            for i in range(16)]

    async def main(srv):
        async with httpx.AsyncClient(base_url=srv["url"], timeout=600) as client:
            return await asyncio.gather(*(_stream(client, p, **kw) for p, kw in jobs))

    got, want = asyncio.run(main(on)), asyncio.run(main(off))
    for (g, _), (w, _) in zip(got, want, strict=True):
        assert g == w
    assert any(n > 1 for _, sizes in got for n in sizes)  # a verified run in one chunk
    assert all(n == 1 for _, sizes in want for n in sizes)


def test_sixteen_streams_at_once_equal_their_solo_runs(servers):
    """Batching never changes a greedy answer: 16 concurrent streams on the plain server
    equal each prompt streamed alone, token for token with its logprobs (the kernels the
    registry chose on this host, AMX tiles included)."""
    _, off = servers
    prompts = [f"{PROMPTS[i % 4]} (case {i})" for i in range(16)]

    async def main():
        async with httpx.AsyncClient(base_url=off["url"], timeout=600) as client:
            solo = [(await _stream(client, p, ignore_eos=True))[0] for p in prompts]
            together = await asyncio.gather(*(_stream(client, p, ignore_eos=True)
                                             for p in prompts))
            return solo, [got for got, _ in together]

    solo, together = asyncio.run(main())
    assert all(len(got) == 24 for got in solo)
    assert [i for i, (a, b) in enumerate(zip(solo, together, strict=True)) if a != b] == []


def test_chat_and_seeded_sampling_equal_plain(servers):
    on, off = servers
    msgs = [{"role": "user", "content": f"Repeat this sentence exactly: {PASSAGE}"}]
    for extra in ({"temperature": 0}, {"temperature": 0.8, "top_p": 0.9, "seed": 7},
                  {"temperature": 1.0, "seed": 1234, "logprobs": True, "top_logprobs": 2}):
        body = {"model": "demo", "messages": msgs, "max_tokens": 24, **extra}
        a = httpx.post(on["url"] + "/v1/chat/completions", json=body, timeout=300).json()
        b = httpx.post(off["url"] + "/v1/chat/completions", json=body, timeout=300).json()
        assert a["choices"] == b["choices"] and a["usage"] == b["usage"], extra


def test_bench_serve_text_workload_on_both(servers, tmp_path, capsys):
    """`bench serve --workload code-edit --url <spec> --compare-url <plain>`: the server
    tokenizes the chat prompts, both give the same number of tokens (counted from the usage
    chunk, though the speculative one sends several per chunk), the comparison prints."""
    from cli.main import main

    on, off = servers
    out = tmp_path / "spec-serve.json"
    rc = main(["bench", "serve", "--url", on["url"], "--compare-url", off["url"],
               "--workload", "code-edit", "--concurrency", "2", "--num-prompts", "2",
               "--output-len", "24", "--json-out", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    runs = {r["config"]["url"]: r for r in data["runs"]}
    for run in runs.values():
        assert (run["completed"], run["failed"], run["total_output_tokens"]) == (2, 0, 48)
    assert runs[on["url"]]["prompt_tokens"] == runs[off["url"]]["prompt_tokens"] > 100
    (row,) = data["comparison"]["servers"]
    assert row["url"] == on["url"] and row["throughput_ratio"] > 0
    assert on["url"] in capsys.readouterr().out


def test_bench_serve_refuses_a_bad_config_before_starting_anything():
    from cli.main import CliError, build_parser

    args = build_parser().parse_args(["bench", "serve", "--speculative-config",
                                      '{"method": "ngram", "k": 1}'])
    with pytest.raises(CliError, match="'k'"):
        args.func(args)
