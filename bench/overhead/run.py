"""What the engine loop and HTTP serving cost around the forward pass: greedy decode tok/s
of the same C sequences three ways, in interleaved rounds (the order rotates each round):

* ``runner``: the model runner alone (ModelRunner.run, then each row's argmax), the C
  sequences prefilled in one step and then decoded in batched steps: the forward pass's
  own speed, the floor of the other two;
* ``engine``: the same loaded runner behind an :class:`engine.engine.Engine` (scheduler,
  sampler, detokenizer, stop checks, outputs to a sink on the engine thread);
* ``http``: an `fp8serve serve` of the same checkpoint and threads (started once), C
  concurrent streamed /v1/completions of the same prompt ids (temperature 0,
  ignore_eos), read by an aiohttp client in this process.

Decode tok/s = C * (gen_len - 1) / (the time from the latest first token to the latest
end): the prefill and its first token are left out. Ratios engine / runner and
http / engine are medians of per-round ratios. Two CPU-time figures, which a busy shared
host disturbs less than wall-clock ones (a thread's CPU clock stops while it waits for a
core): the engine thread's CPU per step outside ModelRunner.run (scheduler, sampler,
detokenizer, stop checks, outputs; that thread's own: what an ATen op spreads over its
other threads is not counted, nor the wait for them), and the server's event-loop thread
CPU per streamed token (Linux /proc; the HTTP edge: parsing, SSE encoding, the asyncio
handoff). On a host with few cores both compete with the forward pass for them.
The passes must agree: the engine's ids equal the runner's, the server's text the
engine's (a mismatch is reported, as a failed check)."""

from __future__ import annotations

import asyncio
import os
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from bench.generate.run import bench_prompt
from engine.stream import EngineObserver

PASSES = ("runner", "engine", "http")
Log = Callable[[str], object]


@dataclass(frozen=True)
class OverheadBenchConfig:
    model_dir: Path
    concurrency: tuple[int, ...] = (1, 8)
    prompt_len: int = 32
    gen_len: int = 64
    rounds: int = 3
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.prompt_len < 1 or self.gen_len < 2 or self.rounds < 1:
            raise ValueError("need prompt_len >= 1, gen_len >= 2 and rounds >= 1")
        if min(self.concurrency, default=0) < 1:
            raise ValueError("need concurrency >= 1")


@dataclass
class Pass:
    tok_s: float
    ids: list[list[int]] | None  # per sequence (runner, engine)
    texts: list[str] | None  # per sequence (engine, http)
    # engine: its thread's CPU s per step outside the forward; http: event-loop CPU s per
    # token
    cost: float | None = None


class TimedRunner:
    """A runner whose ``run`` adds up the CPU time of the thread calling it (the engine's,
    ``thread``); everything else is the runner's."""

    def __init__(self, runner: Any) -> None:
        self._runner = runner
        self.cpu = 0.0
        self.thread: int | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)

    def run(self, batch: Any) -> Any:
        self.thread = threading.get_ident()
        t0 = time.thread_time()
        try:
            return self._runner.run(batch)
        finally:
            self.cpu += time.thread_time() - t0

    def thread_cpu(self) -> float:
        """The calling thread's CPU seconds so far, read from any thread (0 before the
        first step)."""
        if self.thread is None:
            return 0.0
        return time.clock_gettime(time.pthread_getcpuclockid(self.thread))


class StepCount(EngineObserver):
    def __init__(self) -> None:
        self.steps = 0

    def on_step(self, seconds: float, num_decode_rows: int, num_prefill_tokens: int) -> None:
        self.steps += 1


def thread_cpu_s(pid: int, tid: int) -> float | None:
    """user + system CPU seconds of thread ``tid`` of process ``pid`` (None off Linux)."""
    try:
        stat = open(f"/proc/{pid}/task/{tid}/stat").read()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[1].split()  # from field 3 (state) on
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def blocks_per_seq(runner: Any, prompt_len: int, gen_len: int) -> int:
    return -(-(prompt_len + gen_len) // runner.block_size)


def runner_pass(runner: Any, base: int, prompts: list[list[int]], gen_len: int) -> Pass:
    """The KV blocks from ``base`` on are this pass's (the engine's allocator stops
    below it)."""
    from engine.batch import BatchInputs, SeqChunk

    per = blocks_per_seq(runner, len(prompts[0]), gen_len)
    chunks = [SeqChunk(i, tuple(p), 0, tuple(range(base + i * per, base + (i + 1) * per)),
                       prompt_len=len(p)) for i, p in enumerate(prompts)]
    ids: list[list[int]] = [[] for _ in prompts]

    def step() -> None:
        logits = runner.run(BatchInputs(tuple(chunks)))
        for i, row in enumerate(logits):
            ids[i].append(int(row.argmax()))

    step()
    t0 = time.perf_counter()
    for _ in range(gen_len - 1):
        chunks[:] = [SeqChunk(c.seq_id, (out[-1],), c.start_pos + c.num_tokens,
                              c.block_table, prompt_len=c.prompt_len)
                     for c, out in zip(chunks, ids, strict=True)]
        step()
    return Pass(len(prompts) * (gen_len - 1) / (time.perf_counter() - t0), ids, None)


class EnginePass:
    """C greedy requests through a started Engine; outputs collected from its sinks."""

    def __init__(self, engine: Any, runner: TimedRunner, steps: StepCount) -> None:
        self.engine, self.runner, self.steps = engine, runner, steps
        self.n = 0

    def __call__(self, prompts: list[list[int]], gen_len: int) -> Pass:
        from engine.sampling_params import SamplingParams

        done = threading.Semaphore(0)
        first: list[float] = [0.0] * len(prompts)
        end: list[float] = [0.0] * len(prompts)
        ids: list[list[int]] = [[] for _ in prompts]
        texts = [""] * len(prompts)

        def sink(i: int) -> Callable[[Any], None]:
            def put(out: Any) -> None:
                now = time.perf_counter()
                first[i] = first[i] or now
                ids[i] += out.token_ids
                texts[i] += out.text
                if out.finished:
                    end[i] = now
                    done.release()
            return put

        params = SamplingParams(max_tokens=gen_len, temperature=0.0, ignore_eos=True)
        before = self.runner.thread_cpu(), self.runner.cpu, self.steps.steps
        for i, p in enumerate(prompts):
            self.n += 1
            self.engine.add_request(f"overhead-{self.n}", p, params, sink(i))
        for _ in prompts:
            done.acquire()
        cpu, forward, steps = (self.runner.thread_cpu() - before[0],
                               self.runner.cpu - before[1], self.steps.steps - before[2])
        return Pass(len(prompts) * (gen_len - 1) / (max(end) - max(first)), ids, texts,
                    (cpu - forward) / steps if before[0] else None)


async def _http_one(session: Any, url: str, model: str, prompt: list[int], gen_len: int
                    ) -> tuple[float, float, str]:
    import json

    from bench.serve.client import sse_data

    body = {"model": model, "prompt": prompt, "max_tokens": gen_len, "stream": True,
            "temperature": 0.0, "ignore_eos": True}
    first, text, buffered = 0.0, "", b""
    async with session.post(url + "/v1/completions", json=body) as r:
        r.raise_for_status()
        async for received in r.content.iter_any():
            now = time.perf_counter()
            payloads, buffered = sse_data(buffered, received)
            for data in payloads:
                if data != b"[DONE]":
                    piece = json.loads(data)["choices"][0].get("text") or ""
                    first, text = first or now, text + piece
    return first, time.perf_counter(), text


def http_pass(url: str, model: str, pid: int | None, prompts: list[list[int]],
              gen_len: int) -> Pass:
    """``pid``: the server's (its main thread runs the event loop)."""
    import aiohttp

    async def go() -> list[tuple[float, float, str]]:
        async with aiohttp.ClientSession() as session:
            return await asyncio.gather(*(_http_one(session, url, model, p, gen_len)
                                          for p in prompts))

    cpu0 = None if pid is None else thread_cpu_s(pid, pid)
    got = asyncio.run(go())
    cpu1 = None if pid is None else thread_cpu_s(pid, pid)
    span = max(e for _, e, _ in got) - max(f for f, _, _ in got)
    cost = None if cpu0 is None or cpu1 is None else (cpu1 - cpu0) / (len(prompts) * gen_len)
    return Pass(len(prompts) * (gen_len - 1) / span, None, [t for _, _, t in got], cost)


def _ratio(a: list[float], b: list[float]) -> float:
    return statistics.median(x / y for x, y in zip(a, b, strict=True))


def _summary(tok_s: dict[str, list[float]], costs: dict[str, list[float]],
             agree: bool) -> dict[str, Any]:
    res: dict[str, Any] = {"tok_s": tok_s, "outputs_agree": agree,
                           "median_tok_s": {k: statistics.median(v) for k, v in tok_s.items()},
                           "engine_over_runner": _ratio(tok_s["engine"], tok_s["runner"]),
                           "engine_cpu_ms_per_step": 1e3 * statistics.median(costs["engine"])}
    if "http" in tok_s:
        res["http_over_engine"] = _ratio(tok_s["http"], tok_s["engine"])
        res["http_over_runner"] = _ratio(tok_s["http"], tok_s["runner"])
        if costs["http"]:  # the mean: /proc counts in clock ticks (10 ms), every pass
            res["loop_cpu_ms_per_token"] = 1e3 * statistics.mean(costs["http"])
    return res


def measure(cfg: OverheadBenchConfig, passes: dict[str, Callable[..., Pass]],
            vocab: int, log: Log) -> dict[str, Any]:
    """Per concurrency: each pass's tok/s per round, medians, ratios and agreement."""
    results: dict[str, Any] = {}
    for c in cfg.concurrency:
        prompts = [bench_prompt(vocab, cfg.prompt_len, seed=i) for i in range(c)]
        for fn in passes.values():  # warm-up (first-call costs, the prefix cache)
            fn(prompts, cfg.gen_len)
        tok_s: dict[str, list[float]] = {k: [] for k in passes}
        costs: dict[str, list[float]] = {k: [] for k in passes}
        agree = True
        for r in range(cfg.rounds):
            names = list(passes)[r % len(passes):] + list(passes)[:r % len(passes)]
            got = {k: passes[k](prompts, cfg.gen_len) for k in names}
            for k, p in got.items():
                tok_s[k].append(p.tok_s)
                if p.cost is not None:
                    costs[k].append(p.cost)
            agree &= got["runner"].ids == got["engine"].ids
            if "http" in got:
                agree &= got["http"].texts == got["engine"].texts
            log(f"C={c} round {r + 1}: " + ", ".join(f"{k} {got[k].tok_s:.1f}"
                                                     for k in passes) + " tok/s")
        results[str(c)] = _summary(tok_s, costs, agree)
    return results


def run_overhead_bench(cfg: OverheadBenchConfig, server: tuple[str, str, int] | None,
                       log: Log = print) -> dict[str, Any]:
    """Load the runner here; ``server``: (URL, model name, pid) of the http pass's server
    (None: no http pass)."""
    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.runner import load_runner
    from engine.text.tokenizer import Tokenizer

    ecfg = EngineConfig(model_dir=cfg.model_dir, max_num_seqs=max(16, *cfg.concurrency),
                        threads=cfg.threads)
    runner = load_runner(cfg.model_dir, ecfg)
    # the runner pass's blocks, kept out of the engine's allocator (and prefix cache)
    runner.num_kv_blocks -= max(cfg.concurrency) * blocks_per_seq(runner, cfg.prompt_len,
                                                                  cfg.gen_len)
    base = runner.num_kv_blocks
    timed, steps = TimedRunner(runner), StepCount()
    engine = Engine(timed, Tokenizer.from_dir(cfg.model_dir), ecfg, observer=steps)
    engine.start()
    passes: dict[str, Callable[..., Pass]] = {
        "runner": lambda p, n: runner_pass(runner, base, p, n),
        "engine": EnginePass(engine, timed, steps)}
    if server is not None:
        url, name, pid = server
        passes["http"] = lambda p, n: http_pass(url, name, pid, p, n)
    try:
        with torch.inference_mode():
            results = measure(cfg, passes, runner.config.vocab_size, log)
    finally:
        engine.shutdown()
    return {"config": asdict(cfg) | {"model_dir": str(cfg.model_dir)},
            "threads": torch.get_num_threads(), "results": results}
