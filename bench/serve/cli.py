"""`fp8serve bench serve --url URL --concurrency C [C ...] --num-prompts N --input-len I
--output-len O [--rounds R] [--workload random|multi-turn|shared-prefix] [--system-len S]
[--turns T] [--compare-url URL2 | --speculative-config JSON | --compare-server-arg FLAG |
--prediction | --llama-server]`: drive a running server (see bench/serve/run.py and, for
the workloads and their cache on / off passes, bench/serve/workloads.py), or a pair it
starts itself
(bench/serve/servers.py); print a table per pass, the comparisons
(bench/serve/comparison.py), and write JSON (every pass, the medians over the rounds, the
comparison rows)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.common.errors import BenchError
from bench.common.flags import require_at_least


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="TTFT / TPOT / ITL and throughput of a running server")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    p.add_argument("--compare-url", default=None,
                   help="a second server driven interleaved with the first (e.g. one started "
                        "with --no-enable-prefix-caching); both get every pass")
    p.add_argument("--workload", default="random",
                   choices=("random", "multi-turn", "shared-prefix", "grounded", "code-edit",
                            "story"),
                   help="random: no shared prefix; multi-turn: conversations resending "
                        "their history; shared-prefix: one system prompt, many users (these "
                        "two run a cache-on and a cache-off pass per round); grounded, "
                        "code-edit, story: chat prompts in text (quote a passage, edit a "
                        "function, write a story), for --speculative-config")
    p.add_argument("--speculative-config", default=None, metavar="JSON",
                   help="start two servers on --model-dir, one with this speculative config "
                        "(vLLM's JSON) and one without, and drive both interleaved (instead "
                        "of --url / --compare-url); they are stopped at the end")
    p.add_argument("--compare-server-arg", action="append", default=[], metavar="FLAG",
                   help="start two fp8serve servers on --model-dir, the second with this "
                        "`serve` flag added (repeatable; e.g. "
                        "--compare-server-arg=--max-prefill-tokens-with-decodes=128), and drive "
                        "both interleaved; they are stopped at the end")
    p.add_argument("--prediction", action="store_true",
                   help="with --workload grounded or code-edit: start two fp8serve servers on "
                        "--model-dir with the same flags, send both the workload as chat "
                        "requests, those to the second with the passage or function as their "
                        "prediction (OpenAI's predicted outputs, as a client sends them), and "
                        "drive both interleaved; they are stopped at the end")
    p.add_argument("--llama-server", action="store_true",
                   help="start fp8serve on --model-dir and llama.cpp's llama-server on the "
                        "same weights as GGUF (built for this host once, see `fp8serve bench "
                        "llamacpp`), each with max(--concurrency) sequences at once and "
                        "--threads threads, and drive both interleaved (random workload)")
    p.add_argument("--gguf", type=Path, default=None,
                   help="with --llama-server: llama-server's GGUF (default: the demo model's "
                        "original with the demo model, else the checkpoint's --gguf-type "
                        "export, cached beside it)")
    p.add_argument("--gguf-type", choices=("Q8_0", "BF16"), default="Q8_0",
                   help="with --llama-server and a checkpoint: the export llama-server reads")
    p.add_argument("--threads", type=int, default=None,
                   help="with --llama-server: threads of each server (default: all cores)")
    p.add_argument("--model-dir", type=Path, default=None,
                   help="with --speculative-config, --compare-server-arg, --prediction or "
                        "--llama-server: the checkpoint (default: the demo model)")
    p.add_argument("--server-arg", action="append", default=[], metavar="FLAG",
                   help="with --speculative-config, --compare-server-arg, --prediction or "
                        "--llama-server: "
                        "a `serve` flag for the fp8serve server(s) (repeatable; e.g. "
                        "--server-arg=--kv-cache-gib=2)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1],
                   help="in-flight requests (conversations for multi-turn); several values "
                        "run one after another")
    p.add_argument("--num-prompts", type=int, default=16,
                   help="requests per pass; conversations for multi-turn")
    p.add_argument("--input-len", type=int, default=128,
                   help="prompt ids per request (per user turn for multi-turn, after the "
                        "system prompt for shared-prefix)")
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--system-len", type=int, default=500,
                   help="system prompt ids (multi-turn, shared-prefix)")
    p.add_argument("--turns", type=int, default=4, help="turns per conversation (multi-turn)")
    p.add_argument("--model", default=None, help="default: the server's model")
    p.add_argument("--api-key", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=1,
                   help="repeat the sweep over the concurrency levels R times, interleaved; "
                        "each level is reported by its median (for drifting shared hosts)")
    p.add_argument("--json-out", type=Path, default=Path("bench/results/serve.json"))
    p.set_defaults(func=run)


def run_passes(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Every pass of the run, printed as it ends; each summary carries its round."""
    import asyncio

    import aiohttp

    from bench.serve.config import BenchConfig
    from bench.serve.passes import plan, run_pass
    from bench.serve.report import format_table

    servers = [args.url] + ([args.compare_url] if args.compare_url else [])
    try:
        base = BenchConfig(args.url, 1, args.num_prompts, args.input_len, args.output_len,
                           args.model, args.api_key, args.seed, workload=args.workload,
                           system_len=args.system_len, turns=args.turns)
        steps = plan(base, args.rounds, args.concurrency, servers,
                     getattr(args, "per_server", None))
    except ValueError as exc:
        raise BenchError(str(exc)) from exc
    runs = []
    for rnd, cfg, mode in steps:
        try:
            summary = asyncio.run(run_pass(cfg, mode))
        except aiohttp.ClientError as exc:
            raise BenchError(f"cannot reach {cfg.url}: {exc}") from exc
        head = [f"round {rnd + 1} of {args.rounds}"] if args.rounds > 1 else []
        head += [cfg.url] if len(servers) > 1 else []
        if head:
            print(", ".join(head))
        print(format_table(summary), end="\n\n", flush=True)
        runs.append(summary | {"round": rnd})
    return runs


def report(args: argparse.Namespace, levels: list[dict[str, Any]]) -> dict[str, Any]:
    """Prints the comparisons; returns them as JSON rows."""
    from bench.serve.comparison import (
        cache_rows,
        format_cache_table,
        format_server_table,
        server_rows,
    )

    how = f" (medians of {args.rounds} rounds)" if args.rounds > 1 else ""
    mine = [lv for lv in levels if lv["config"]["url"] == args.url]
    base = mine[0]["output_token_throughput"]
    if args.workload == "random" and len(mine) > 1 and base > 0:
        for r in mine[1:]:
            print(f"output throughput at concurrency {r['config']['concurrency']}: "
                  f"{r['output_token_throughput'] / base:.2f}x concurrency "
                  f"{mine[0]['config']['concurrency']}{how}")
    cache, servers = cache_rows(levels), server_rows(levels)
    names = {u: s["name"] for u, s in (getattr(args, "servers", None) or {}).items()}
    for table in (format_cache_table(cache), format_server_table(servers, names)):
        if table:
            print(table, end="\n\n")
    for lv in levels:
        if lv.get("pass") == "uncached" and lv.get("cached_tokens", 0) > 0:
            print(f"note: the uncached pass on {lv['config']['url']} found "
                  f"{lv['cached_tokens']} cached tokens: does that server honour cache_salt?")
    return {"cache": cache, "servers": servers}


def check_ranges(args: argparse.Namespace) -> None:
    """The numeric flags, named as given, before any server is started or driven."""
    require_at_least(args, 1, "--concurrency", "--num-prompts", "--input-len",
                     "--output-len", "--system-len", "--turns", "--rounds")
    if args.workload == "shared-prefix" and args.num_prompts < 2:
        raise BenchError(f"--num-prompts {args.num_prompts}: --workload shared-prefix needs "
                         ">= 2 (the first warms the cache)")


def run(args: argparse.Namespace) -> int:
    from bench.serve.servers import (
        flag_servers,
        llama_servers,
        prediction_servers,
        spec_servers,
    )

    pairs = [name for name, given in (
        ("--compare-url", getattr(args, "compare_url", None) is not None),
        ("--speculative-config", getattr(args, "speculative_config", None) is not None),
        ("--compare-server-arg", bool(getattr(args, "compare_server_arg", None))),
        ("--prediction", getattr(args, "prediction", False)),
        ("--llama-server", getattr(args, "llama_server", False))) if given]
    if len(pairs) > 1:
        raise BenchError(f"{' and '.join(pairs)}: each names the second server; give one")
    check_ranges(args)
    if getattr(args, "prediction", False):
        with prediction_servers(args) as (predicted, plain, info, per_server):
            args.url, args.compare_url, args.servers = predicted, plain, info
            args.per_server = per_server
            return _run(args)
    if getattr(args, "compare_server_arg", None):
        with flag_servers(args) as (first, second, info):
            args.url, args.compare_url, args.servers = first, second, info
            return _run(args)
    if getattr(args, "speculative_config", None) is not None:
        with spec_servers(args) as (on, off):
            args.url, args.compare_url = on, off
            return _run(args)
    if getattr(args, "llama_server", False):
        if args.workload != "random":
            raise BenchError("--llama-server: only the random workload (llama-server has no "
                             "cache_salt, so its cache-off passes would hit its cache)")
        with llama_servers(args) as (mine, theirs, info):
            args.url, args.compare_url, args.servers = mine, theirs, info
            return _run(args)
    return _run(args)


def _run(args: argparse.Namespace) -> int:
    from bench.serve.report import combine_rounds

    runs = run_passes(args)
    levels = combine_rounds(runs)
    comparison = report(args, levels)
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps({"runs": runs, "rounds": args.rounds,
                                         "workload": args.workload, "levels": levels,
                                         "comparison": comparison,
                                         "servers": getattr(args, "servers", None)},
                                        indent=2))
    print(f"wrote {args.json_out}")
    return 0 if all(r["failed"] == 0 for r in runs) else 1
