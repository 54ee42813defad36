"""`fp8serve bench structured`: json_schema-constrained vs unconstrained decode tokens/s
through the engine at several concurrencies, interleaved in one process
(bench/structured/run.py). Prints ratios and the mask share; writes JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bench.common.errors import BenchError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("structured", help="constrained vs unconstrained decode tok/s")
    p.add_argument("--model", type=Path, default=None,
                   help="checkpoint directory (default: the demo model)")
    p.add_argument("--concurrency", default="1,16", help="comma list of concurrencies")
    p.add_argument("--gen-len", type=int, default=48, help="tokens per request")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds (medians)")
    p.add_argument("--threads", type=int, default=None, help="torch threads")
    p.add_argument("--json", type=Path, default=Path("bench/results/structured.json"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bench.structured.run import (
        StructuredBenchConfig,
        format_table,
        run_structured_bench,
    )

    if args.model is not None and not args.model.is_dir():
        raise BenchError(f"--model {args.model}: not a directory")
    if args.model is None:
        from engine.demo_model import ensure_demo_model
        args.model = ensure_demo_model()
    try:
        conc = tuple(int(c) for c in args.concurrency.split(",") if c.strip())
        cfg = StructuredBenchConfig(args.model, conc, args.gen_len, args.rounds, args.threads)
    except ValueError as exc:
        raise BenchError(str(exc)) from exc
    res = run_structured_bench(cfg, log=lambda s: print(s, flush=True))
    print(format_table(res))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=2))
    print(f"wrote {args.json}")
    return 0
