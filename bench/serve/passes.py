"""One pass of a serving-benchmark workload against one server, and the order of passes
in a run (prompts and salts: bench/serve/workloads.py).

multi-turn: at most ``concurrency`` conversations in flight, each sending its turns one
after another (turn k waits for turn k-1's reply); TTFT is reported per turn index.
shared-prefix: the first request runs alone (with the cache on it pays for the system
prompt), then the rest at ``concurrency``; TTFT and throughput are of the rest.

A run is rounds x concurrency levels x servers (``--url``, then ``--compare-url``) x
passes, interleaved in time so drift on a shared host hits every pass alike; the passes
and the servers swap order every other round so neither always runs first.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import aiohttp

from bench.serve.client import RequestResult, one_request, tokenize, tokenize_chat
from bench.serve.config import BenchConfig
from bench.serve.report import group_summary, summarize
from bench.serve.run import (
    bench_session,
    gather_limited,
    run_bench,
    run_uncached,
)
from bench.serve.workloads import (
    TEXT_WORKLOADS,
    UNCACHED,
    conversations,
    pass_salts,
    passes,
    shared_prefix_prompts,
    turn_prompt,
)


async def one_conversation(session: aiohttp.ClientSession, cfg: BenchConfig, model: str,
                           system: list[int], users: list[list[int]], salts: list[str]
                           ) -> list[RequestResult]:
    """The turns of one conversation, each resending the whole history; stops at the
    first failed turn. Raises aiohttp.ClientError when a reply cannot be tokenized."""
    replies: list[list[int]] = []
    results = []
    for turn in range(cfg.turns):
        res = await one_request(session, cfg, model, turn_prompt(system, users, replies),
                                salts[turn])
        results.append(res)
        if not res.ok:
            break
        if turn + 1 < cfg.turns:
            replies.append(await tokenize(session, cfg, model, res.text))
    return results


async def run_multi_turn(cfg: BenchConfig, mode: str) -> dict[str, Any]:
    convs = conversations(cfg.num_prompts, cfg.turns, cfg.system_len, cfg.input_len,
                          cfg.vocab_lo, cfg.vocab_hi, cfg.seed)
    salts = pass_salts(mode, len(convs), cfg.turns)
    async with bench_session(cfg) as (session, model):
        jobs = [lambda c=c, s=s: one_conversation(session, cfg, model, c[0], c[1], s)
                for c, s in zip(convs, salts, strict=True)]
        start = time.perf_counter()
        per_conv = await gather_limited(cfg.concurrency, jobs)
        duration = time.perf_counter() - start
    turns = [[conv[k] for conv in per_conv if len(conv) > k] for k in range(cfg.turns)]
    return summarize(cfg, [r for conv in per_conv for r in conv], duration) | {
        "groups": [group_summary(f"turn {k + 1}", t) for k, t in enumerate(turns)]}


async def run_shared_prefix(cfg: BenchConfig, mode: str) -> dict[str, Any]:
    prompts = shared_prefix_prompts(cfg.num_prompts, cfg.system_len, cfg.input_len,
                                    cfg.vocab_lo, cfg.vocab_hi, cfg.seed)
    salts = [s[0] for s in pass_salts(mode, len(prompts))]
    async with bench_session(cfg) as (session, model):
        first = await one_request(session, cfg, model, prompts[0], salts[0])
        jobs = [lambda p=p, s=s: one_request(session, cfg, model, p, s)
                for p, s in zip(prompts[1:], salts[1:], strict=True)]
        start = time.perf_counter()
        rest = await gather_limited(cfg.concurrency, jobs)
        duration = time.perf_counter() - start
    return summarize(cfg, rest, duration) | {
        "groups": [group_summary("first", [first]), group_summary("rest", rest)]}


async def run_text(cfg: BenchConfig) -> dict[str, Any]:
    """A text workload: request i is workload_messages(workload, i), tokenized by the
    server and sent as ids (or, with ``cfg.chat``, sent as the messages); each request has
    its own cache salt."""
    from bench.spec.workloads import workload_messages

    chats = [workload_messages(cfg.workload, i) for i in range(cfg.num_prompts)]
    async with bench_session(cfg) as (session, model):
        prompts = [await tokenize_chat(session, cfg, model, m) for m in chats]
        return await run_uncached(session, cfg, model, prompts, chats if cfg.chat else None)


async def run_pass(cfg: BenchConfig, mode: str) -> dict[str, Any]:
    """One pass (workloads.CACHED / UNCACHED) of cfg.workload against cfg.url: its
    summary, labelled with the pass. Raises aiohttp.ClientError when the server cannot
    be reached or has no model."""
    if cfg.workload == "random":
        return await run_bench(cfg)
    if cfg.workload in TEXT_WORKLOADS:
        return await run_text(cfg) | {"pass": UNCACHED}
    run = run_multi_turn if cfg.workload == "multi-turn" else run_shared_prefix
    return await run(cfg, mode) | {"pass": mode}


def plan(base: BenchConfig, rounds: int, levels: list[int], servers: list[str],
         per_server: dict[str, dict[str, Any]] | None = None
         ) -> list[tuple[int, BenchConfig, str]]:
    """(round, config, pass) of every pass of a run, in the order they run;
    ``per_server``: config fields that differ by server URL."""
    out = []
    for rnd in range(rounds):
        order, hosts = passes(base.workload), servers
        if rnd % 2:
            order, hosts = order[::-1], hosts[::-1]
        for conc in levels:
            for url in hosts:
                cfg = dataclasses.replace(base, url=url, concurrency=conc, round=rnd,
                                          **(per_server or {}).get(url, {}))
                out += [(rnd, cfg, mode) for mode in order]
    return out
