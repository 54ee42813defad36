"""`fp8serve bench serve --url URL --concurrency C --num-prompts N --input-len I
--output-len O`: drive a running server (see service/bench_serve.py); print a table and
write JSON."""

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
    p.add_argument("--json-out", type=Path, default=Path("bench/results/serve.json"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import asyncio

    import httpx

    from service.bench_serve import BenchConfig, format_table, run_bench

    runs = []
    for conc in args.concurrency:
        try:
            cfg = BenchConfig(args.url, conc, args.num_prompts, args.input_len,
                              args.output_len, args.model, args.api_key, args.seed)
            summary = asyncio.run(run_bench(cfg))
        except ValueError as exc:
            raise CliError(str(exc)) from exc
        except httpx.HTTPError as exc:
            raise CliError(f"cannot reach {args.url}: {exc}") from exc
        print(format_table(summary), end="\n\n", flush=True)
        runs.append(summary)
    if len(runs) > 1 and runs[0]["output_token_throughput"] > 0:
        base = runs[0]["output_token_throughput"]
        for r in runs[1:]:
            print(f"output throughput at concurrency {r['config']['concurrency']}: "
                  f"{r['output_token_throughput'] / base:.2f}x concurrency "
                  f"{runs[0]['config']['concurrency']}")
    args.json_out.parent.mkdir(parents=True, exist_ok=True)
    args.json_out.write_text(json.dumps({"runs": runs}, indent=2))
    print(f"wrote {args.json_out}")
    return 0 if all(r["failed"] == 0 for r in runs) else 1
