"""End to end: a real `fp8serve serve` subprocess (uvicorn on a free loopback port) over a
tiny random FP8 checkpoint with the Tekken tokenizer, driven by the real `openai` client.
One server for the whole module (startup dominates); the SIGTERM drain test runs last."""

import asyncio
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import urllib.parse
from pathlib import Path

import httpx
import openai
import pytest

from tests.service.serve_process import free_port, start_server, stop_server

KEY = "test-key"
MAX_SEQS, MAX_QUEUE = 16, 4


@pytest.fixture(scope="module")
def server(tiny_checkpoint):
    model = tiny_checkpoint(vocab_size=131072, tokenizer=True)
    srv = start_server(model, "--api-key", KEY, "--max-num-seqs", str(MAX_SEQS),
                       "--max-queue", str(MAX_QUEUE), "--max-model-len", "4096",
                       "--kv-cache-gib", "0.2", "--drain-timeout", "60",
                       "--served-model-name", "tiny")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server["url"] + "/v1", api_key=KEY, max_retries=0)


def metric(server, name: str) -> float:
    text = httpx.get(server["url"] + "/metrics").text
    values = re.findall(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M)
    assert values, f"{name} not in /metrics"
    return sum(float(v) for v in values)  # over every label set (api, ...)


def test_completion_n_logprobs_and_stop(client):
    r = client.completions.create(model="tiny", prompt="The capital of France is",
                                  max_tokens=8, temperature=0, n=2, logprobs=2,
                                  extra_body={"ignore_eos": True})
    assert len(r.choices) == 2 and r.choices[0].text == r.choices[1].text  # greedy
    assert r.choices[0].finish_reason == "length" and r.usage.completion_tokens == 16
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == 8 and all(len(t) == 2 for t in lp.top_logprobs)
    assert "".join(lp.tokens) == r.choices[0].text
    stop = r.choices[0].text[len(r.choices[0].text) // 2:][:3]
    cut = r.choices[0].text.index(stop)
    s = client.completions.create(model="tiny", prompt="The capital of France is",
                                  max_tokens=8, temperature=0, stop=[stop],
                                  extra_body={"ignore_eos": True})
    assert s.choices[0].finish_reason == "stop" and s.choices[0].text == r.choices[0].text[:cut]


def test_chat_and_streaming_agree(client):
    msgs = [{"role": "user", "content": "Say hi"}]
    full = client.chat.completions.create(model="tiny", messages=msgs, max_tokens=6,
                                          temperature=0, logprobs=True, top_logprobs=1)
    assert len(full.choices[0].logprobs.content) == full.usage.completion_tokens
    chunks = list(client.chat.completions.create(
        model="tiny", messages=msgs, max_tokens=6, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens


def test_errors_are_the_clients_exception_classes(server, client):
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model="tiny", prompt="hi", max_tokens=5000)
    assert e.value.body["param"] == "max_tokens"
    with pytest.raises(openai.BadRequestError, match="does not take images"):
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:,"}}]}])
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="other", prompt="hi")
    bad = openai.OpenAI(base_url=server["url"] + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()
    assert httpx.get(server["url"] + "/health").status_code == 200  # no key needed


async def _stream(aclient, prompt: str, n_tokens: int) -> list[str]:
    s = await aclient.completions.create(model="tiny", prompt=prompt, max_tokens=n_tokens,
                                         temperature=0, stream=True, logprobs=0,
                                         extra_body={"ignore_eos": True})
    return [t async for c in s for t in c.choices[0].logprobs.tokens]


def test_16_concurrent_streams_equal_solo_runs(server, client):
    """Greedy outputs of 16 concurrent streams equal their solo runs token for token: the
    model's GEMMs, lm_head and attention are batch-invariant and greedy sampling reads
    only a row's own logits, so batching must not change a single token."""
    prompts = [f"Request number {i} asks about topic {i * 7}" for i in range(16)]
    solo = [client.completions.create(model="tiny", prompt=p, max_tokens=12, temperature=0,
                                      logprobs=2, extra_body={"ignore_eos": True}
                                      ).choices[0].logprobs.tokens for p in prompts]

    async def main():
        aclient = openai.AsyncOpenAI(base_url=server["url"] + "/v1", api_key=KEY,
                                     max_retries=0)
        return await asyncio.gather(*(_stream(aclient, p, 12) for p in prompts))

    together = asyncio.run(main())
    assert [len(got) for got in together] == [12] * 16
    mismatched = [i for i, (want, got) in enumerate(zip(solo, together, strict=True))
                  if got != want]
    assert not mismatched, [(i, solo[i], together[i]) for i in mismatched]


def test_disconnect_frees_slot_and_full_queue_answers_429(server):
    """MAX_SEQS + MAX_QUEUE long streams fill every slot and the queue; one more gets
    429; dropping the streams aborts them and running falls back to 0."""
    aborted0 = metric(server, "fp8serve_requests_aborted_total")
    headers = {"Authorization": f"Bearer {KEY}"}
    body = {"model": "tiny", "prompt": "go", "max_tokens": 4000, "stream": True,
            "ignore_eos": True}
    hc = httpx.Client(base_url=server["url"], headers=headers, timeout=30,
                      limits=httpx.Limits(max_connections=64))
    streams = []
    for _ in range(MAX_SEQS + MAX_QUEUE):
        cm = hc.stream("POST", "/v1/completions", json=body)
        resp = cm.__enter__()
        assert resp.status_code == 200
        lines = resp.iter_lines()  # keep a reference: dropping it closes the stream
        streams.append((cm, lines))
    deadline = time.monotonic() + 60
    while (metric(server, "fp8serve_num_requests_running") < MAX_SEQS
           or metric(server, "fp8serve_num_requests_waiting") < MAX_QUEUE):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    oc = openai.OpenAI(base_url=server["url"] + "/v1", api_key=KEY, max_retries=0)
    with pytest.raises(openai.RateLimitError) as e:
        oc.completions.create(model="tiny", prompt="one more", max_tokens=2)
    assert e.value.response.headers["retry-after"]
    for cm, _ in streams:
        cm.__exit__(None, None, None)
    hc.close()
    deadline = time.monotonic() + 60
    while (metric(server, "fp8serve_num_requests_running") > 0
           or metric(server, "fp8serve_num_requests_waiting") > 0):
        assert time.monotonic() < deadline, "aborted requests still hold slots"
        time.sleep(0.2)
    assert metric(server, "fp8serve_kv_cache_usage_perc") == 0.0
    assert metric(server, "fp8serve_requests_aborted_total") >= aborted0 + MAX_SEQS


def test_bench_serve_against_the_server(server, tmp_path):
    from bench.serve.config import BenchConfig
    from bench.serve.report import format_table
    from bench.serve.run import run_bench

    s = asyncio.run(run_bench(BenchConfig(server["url"], concurrency=2, num_prompts=4,
                                          input_len=16, output_len=4, api_key=KEY)))
    assert s["completed"] == 4 and s["failed"] == 0 and s["total_output_tokens"] == 16
    assert 0 < s["ttft_s"]["p50"] <= s["e2el_s"]["p99"]
    assert "TTFT" in format_table(s)


def test_bench_serve_cli_rounds_interleave_levels(server, tmp_path, capsys):
    from cli.main import main

    out = tmp_path / "serve.json"
    rc = main(["bench", "serve", "--url", server["url"], "--api-key", KEY, "--concurrency", "1",
               "2", "--num-prompts", "2", "--input-len", "8", "--output-len", "3",
               "--rounds", "2", "--json-out", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    assert [(r["round"], r["config"]["concurrency"]) for r in data["runs"]] == [
        (0, 1), (0, 2), (1, 1), (1, 2)]
    assert [lv["config"]["concurrency"] for lv in data["levels"]] == [1, 2]
    assert all(lv["rounds"] == 2 and lv["completed"] == 4 for lv in data["levels"])
    assert "medians of 2 rounds" in capsys.readouterr().out


def test_bench_serve_cli_errors_name_the_cause(server, tmp_path, capsys):
    from cli.main import main

    closed = f"http://127.0.0.1:{free_port()}"
    rc = main(["bench", "serve", "--url", closed, "--json-out", str(tmp_path / "a.json")])
    assert rc != 0 and f"cannot reach {closed}" in capsys.readouterr().err
    # a wrong key: the model list is refused, so nothing is benchmarked
    rc = main(["bench", "serve", "--url", server["url"], "--api-key", "wrong",
               "--json-out", str(tmp_path / "b.json")])
    assert rc != 0 and "401" in capsys.readouterr().err
    # with the model named too: the model list is checked first, so nothing is sent
    rc = main(["bench", "serve", "--url", server["url"], "--api-key", "wrong", "--model", "m",
               "--num-prompts", "2", "--input-len", "4", "--output-len", "2",
               "--json-out", str(tmp_path / "c.json")])
    assert rc != 0 and "401" in capsys.readouterr().err
    assert not (tmp_path / "c.json").exists()


def test_bench_serve_refuses_a_model_the_server_does_not_serve(server, tmp_path, capsys):
    from cli.main import main

    refused = metric(server, "fp8serve_requests_rejected_total")
    # was: every request sent (each a 404), an empty results table, then the 404
    rc = main(["bench", "serve", "--url", server["url"], "--api-key", KEY, "--model",
               "nonexistent", "--num-prompts", "4", "--input-len", "4", "--output-len", "2",
               "--json-out", str(tmp_path / "d.json")])
    captured = capsys.readouterr()
    assert rc == 1 and "TTFT" not in captured.out
    assert captured.err.strip().splitlines()[-1] == (
        f"fp8serve: error: --model nonexistent: {server['url']} does not serve it (it "
        "serves tiny)")
    assert not (tmp_path / "d.json").exists()
    assert metric(server, "fp8serve_requests_rejected_total") == refused  # none sent
    # a model it serves runs
    assert main(["bench", "serve", "--url", server["url"], "--api-key", KEY, "--model",
                 "tiny", "--num-prompts", "1", "--input-len", "4", "--output-len", "2",
                 "--json-out", str(tmp_path / "e.json")]) == 0


def test_prometheus_scrapes_kernel_metric(server):
    binary = shutil.which("prometheus")
    if binary is None:
        if os.environ.get("FP8SERVE_REQUIRE_PROMETHEUS") == "1":
            pytest.fail("prometheus binary not found (apt-get install -y prometheus)")
        pytest.skip("prometheus binary not found: apt-get install -y prometheus "
                    "(set FP8SERVE_REQUIRE_PROMETHEUS=1 to make this a failure)")
    kernels = httpx.get(server["url"] + "/kernels",
                        headers={"Authorization": f"Bearer {KEY}"}).json()
    chosen = {layer["kernel_id"] for layer in kernels["layers"]}
    target = urllib.parse.urlparse(server["url"]).netloc
    repo = Path(__file__).resolve().parents[2]
    config = (repo / "deploy" / "prometheus.yml").read_text()
    config = config.replace("localhost:8000", target).replace("15s", "1s")
    work = Path(tempfile.mkdtemp())
    (work / "prometheus.yml").write_text(config)
    port = free_port()
    proc = subprocess.Popen([binary, f"--config.file={work / 'prometheus.yml'}",
                             f"--storage.tsdb.path={work / 'data'}",
                             f"--web.listen-address=127.0.0.1:{port}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        result, deadline = [], time.monotonic() + 120
        while not result:
            assert proc.poll() is None, "prometheus exited"
            assert time.monotonic() < deadline, "prometheus never returned the metric"
            time.sleep(1)
            try:
                r = httpx.get(f"http://127.0.0.1:{port}/api/v1/query",
                              params={"query": "fp8serve_kernel_selected"}, timeout=5)
                result = r.json()["data"]["result"]
            except (httpx.HTTPError, KeyError, json.JSONDecodeError):
                continue
        scraped = {s["metric"]["kernel"] for s in result}
        assert scraped == chosen
        assert sum(float(s["value"][1]) for s in result) == len(kernels["layers"])
    finally:
        proc.terminate()
        proc.wait(10)
        shutil.rmtree(work, ignore_errors=True)


def test_kernels_and_metrics_show_each_decoder_layers_path(server):
    """/kernels lists every decoder layer's path (the fused C++ op or the Python layers,
    and why) and fp8serve_decoder_layers counts them; layers whose linears all run one
    kernel family the op calls are fused."""
    from engine.model.decode_step import family_of

    kernels = httpx.get(server["url"] + "/kernels",
                        headers={"Authorization": f"Bearer {KEY}"}).json()
    decoder = kernels["decoder_layers"]
    assert [d["index"] for d in decoder] == list(range(len(decoder))) and decoder
    assert all((d["path"] == "fused") == (d["reason"] is None) for d in decoder)
    linears = [c["kernel_id"] for c in kernels["layers"] if c["layer"].startswith("layers.")]
    assert len(linears) == 4 * len(decoder)  # qkv, o, gate_up, down of each layer
    fusable = all(family_of(k) for k in linears)
    fused = sum(d["path"] == "fused" for d in decoder)
    assert fused == (len(decoder) if fusable else 0), decoder
    assert metric(server, "fp8serve_decoder_layers") == len(decoder)
    if fused:
        text = httpx.get(server["url"] + "/metrics").text
        assert f'fp8serve_decoder_layers{{path="fused",reason=""}} {float(fused)}' in text


def test_sigterm_drains_then_exits(server):
    """Last in this module: it stops the shared server."""
    proc, url = server["proc"], server["url"]
    headers = {"Authorization": f"Bearer {KEY}"}
    # long enough to outlast the checks below by far (they take milliseconds; this tiny
    # model makes about 100 tokens/s per stream on 2 busy cores, 300 on a fast host)
    body = {"model": "tiny", "prompt": "drain me", "max_tokens": 800, "stream": True,
            "ignore_eos": True, "temperature": 0}
    # a request whose body is still arriving when the drain begins is in flight: it is
    # answered (it was a 503: the engine refused it once its body was read)
    slow = json.dumps({"model": "tiny", "prompt": "slow body", "max_tokens": 2}).encode()
    host, port = url.split("//")[1].split(":")
    sock = socket.create_connection((host, int(port)), timeout=30)
    sock.sendall(f"POST /v1/completions HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer "
                 f"{KEY}\r\nContent-Type: application/json\r\nContent-Length: {len(slow)}"
                 "\r\nConnection: close\r\n\r\n".encode() + slow[:10])
    with httpx.Client(base_url=url, headers=headers, timeout=60) as hc:
        with hc.stream("POST", "/v1/completions", json=body) as resp:
            lines = resp.iter_lines()
            next(lines)
            proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + 10
            while (health := httpx.get(url + "/health")).status_code == 200:
                assert time.monotonic() < deadline, "SIGTERM never started the drain"
                time.sleep(0.01)
            assert health.status_code == 503 and health.json()["status"] == "draining"
            late = hc.post("/v1/completions", json={"model": "tiny", "prompt": "late"})
            assert late.status_code == 503
            sock.sendall(slow[10:])
            answer = b"".join(iter(lambda: sock.recv(65536), b""))
            sock.close()
            assert answer.startswith(b"HTTP/1.1 200"), answer[:300]
            rest = [ln for ln in lines if ln.startswith("data: ")]
    assert rest[-1] == "data: [DONE]"
    assert json.loads(rest[-2][6:])["choices"][0]["finish_reason"] == "length"
    assert proc.wait(60) == 0
