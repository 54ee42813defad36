"""`fp8serve bench generate`: single-stream prefill and decode tokens/s of fp8serve through
the model runner, against same-run baselines (engine/bench/generate_bench.py). Prints a
table and writes JSON."""

from __future__ import annotations

import argparse
from pathlib import Path

from cli.main import CliError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="single-stream prefill/decode tokens/s vs baselines")
    p.add_argument("--model", type=Path, default=None,
                   help="checkpoint directory (default: the demo model, converted once)")
    p.add_argument("--prompt-len", type=int, default=512)
    p.add_argument("--gen-len", type=int, default=64)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--baselines", default="transformers,llamacpp",
                   help="comma list of transformers, llamacpp ('' = none)")
    p.add_argument("--json", type=Path, default=Path("bench/results/generate.json"))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    raise CliError("bench generate: not implemented yet")
