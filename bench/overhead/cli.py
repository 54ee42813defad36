"""`fp8serve bench overhead`: what the engine loop and HTTP serving cost around the
forward pass, greedy decode tok/s of runner alone, engine and HTTP streaming in
interleaved rounds (bench/overhead/run.py). Prints a summary and writes JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.common.errors import BenchError
from bench.common.flags import require_at_least


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("overhead", help="engine loop and HTTP streaming vs the forward pass")
    p.add_argument("--model", type=Path, default=None,
                   help="checkpoint directory (default: the demo model)")
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 8],
                   help="sequences decoded together (concurrent streams over HTTP)")
    p.add_argument("--prompt-len", type=int, default=32)
    p.add_argument("--gen-len", type=int, default=64)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--no-http", action="store_true",
                   help="runner and engine only (no server started)")
    p.add_argument("--port", type=int, default=0, help="the server's port (0: a free one)")
    p.add_argument("--json", type=Path, default=Path("bench/results/overhead.json"))
    p.set_defaults(func=run)


def format_summary(res: dict[str, Any]) -> str:
    lines = [f"{res['config']['model_dir']}: {res['threads']} threads, prompt "
             f"{res['config']['prompt_len']}, {res['config']['gen_len']} tokens"]
    for c, r in res["results"].items():
        med = ", ".join(f"{k} {v:.1f}" for k, v in r["median_tok_s"].items())
        ratios = [f"engine/runner {r['engine_over_runner']:.3f}",
                  f"engine thread outside the forward {r['engine_cpu_ms_per_step']:.3f} "
                  "CPU ms/step"]
        if "http_over_engine" in r:
            ratios += [f"http/engine {r['http_over_engine']:.3f}",
                       f"http/runner {r['http_over_runner']:.3f}"]
        if "loop_cpu_ms_per_token" in r:
            ratios.append(f"server event loop {r['loop_cpu_ms_per_token']:.3f} CPU ms/token")
        lines.append(f"C={c}: decode tok/s (median) {med}; " + ", ".join(ratios)
                     + ("" if r["outputs_agree"] else "; OUTPUTS DIFFER"))
    return "\n".join(lines)


def _server(args: argparse.Namespace, model: Path, stack: Any
            ) -> tuple[str, str, int] | None:
    if args.no_http:
        return None
    from bench.serve.servers import Started, fp8serve_command

    started = Started()
    stack.callback(started.close)
    flags = ["--max-num-seqs", str(max(16, *args.concurrency))]
    if args.threads is not None:
        flags += ["--threads", str(args.threads)]
    url, _ = started.start(fp8serve_command(model, flags), "fp8serve", args.port)
    return url, model.resolve().name, started.procs[-1].pid


def run(args: argparse.Namespace) -> int:
    import contextlib

    from bench.overhead.run import OverheadBenchConfig, run_overhead_bench
    from engine.demo_model import ensure_demo_model

    require_at_least(args, 1, "--concurrency", "--prompt-len", "--rounds", "--threads")
    require_at_least(args, 2, "--gen-len")
    model = args.model or ensure_demo_model()
    if not model.is_dir():
        raise BenchError(f"--model {model}: not a directory")
    cfg = OverheadBenchConfig(model, tuple(args.concurrency), args.prompt_len, args.gen_len,
                              args.rounds, args.threads)
    with contextlib.ExitStack() as stack:
        res = run_overhead_bench(cfg, _server(args, model, stack),
                                 log=lambda s: print(s, flush=True))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=2))
    print(format_summary(res))
    return 0
