"""`fp8serve bench serve --url URL --concurrency C [C ...] --num-prompts N --input-len I
--output-len O [--rounds R]`: drive a running server (see service/bench_serve.py); print a
table per run and write JSON (every run, plus per-level medians over the rounds)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from cli.main import CliError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="TTFT / TPOT / ITL and throughput of a running server")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="server base URL")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1],
                   help="in-flight requests; several values run one after another")
    p.add_argument("--num-prompts", type=int, default=16)
    p.add_argument("--input-len", type=int, default=128)
    p.add_argument("--output-len", type=int, default=64)
    p.add_argument("--model", default=None, help="default: the server's model")
    p.add_argument("--api-key", default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=1,
                   help="repeat the sweep over the concurrency levels R times, interleaved; "
                        "each level is reported by its median (for drifting shared hosts)")
    p.add_argument("--json-out", type=Path, default=Path("bench/results/serve.json"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    import aiohttp

    from service.bench_report import combine_rounds, format_table
    from service.bench_serve import BenchConfig, run_bench

    if args.rounds < 1:
        raise CliError("--rounds must be >= 1")
    runs = []
    for rnd in range(args.rounds):
        for conc in args.concurrency:
            try:
                cfg = BenchConfig(args.url, conc, args.num_prompts, args.input_len,
                                  args.output_len, args.model, args.api_key, args.seed)
                summary = asyncio.run(run_bench(cfg))
            except ValueError as exc:
                raise CliError(str(exc)) from exc
            except aiohttp.ClientError as exc:
                raise CliError(f"cannot reach {args.url}: {exc}") from exc
            if args.rounds > 1:
                print(f"round {rnd + 1} of {args.rounds}")
            print(format_table(summary), end="\n\n", flush=True)
            runs.append(summary | {"round": rnd})
    levels = combine_rounds(runs)
    base = levels[0]["output_token_throughput"]
    if len(levels) > 1 and base > 0:
        how = f" (medians of {args.rounds} rounds)" if args.rounds > 1 else ""
        for r in levels[1:]:
            print(f"output throughput at concurrency {r['config']['concurrency']}: "
                  f"{r['output_token_throughput'] / base:.2f}x concurrency "
                  f"{levels[0]['config']['concurrency']}{how}")
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps({"runs": runs, "rounds": args.rounds,
                                         "levels": levels}, indent=2))
    print(f"wrote {args.json_out}")
    return 0 if all(r["failed"] == 0 for r in runs) else 1
