"""`fp8serve bench attention`: prefill attention alone, the C++ paged-attention op against
torch SDPA on the same bf16 Q/K/V at a model's head shape, in interleaved rounds
(bench/attention/run.py). Prints one line per prompt length and writes JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.common.errors import BenchError
from bench.common.flags import require_at_least


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("attention", help="prefill attention: paged_attention vs torch SDPA")
    p.add_argument("--shape", default="smollm2-135m",
                   help="a synth-model shape (smollm2-135m: the demo model's heads; "
                        "ministral-3-3b, ministral-3-8b) or a checkpoint directory")
    p.add_argument("--lengths", default="512,2048",
                   help="comma-separated prompt lengths (tokens attending causally)")
    p.add_argument("--rounds", type=int, default=3, help="timed calls of each, interleaved")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads both run on (default: torch's, all cores)")
    p.add_argument("--json", type=Path, default=Path("bench/results/attention.json"))
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> Any:
    from bench.attention.run import AttentionBenchConfig, shape_of

    require_at_least(args, 1, "--rounds", "--threads")
    try:
        lengths = tuple(int(n) for n in args.lengths.split(",") if n.strip())
    except ValueError:
        raise BenchError(f"--lengths: expected a comma list of integers, got "
                         f"{args.lengths!r}") from None
    if not lengths or min(lengths) < 1:
        raise BenchError(f"--lengths {args.lengths}: each length must be >= 1")
    try:
        heads, kv_heads, head_dim = shape_of(args.shape)
    except Exception as exc:  # noqa: BLE001 - an unknown shape or an unreadable checkpoint
        raise BenchError(f"--shape {args.shape}: {exc}") from None
    try:
        return AttentionBenchConfig(heads, kv_heads, head_dim, lengths, args.rounds,
                                    args.threads)
    except ValueError as exc:
        raise BenchError(f"--shape {args.shape}: {exc}") from None


def run(args: argparse.Namespace) -> int:
    from bench.attention.run import run_attention_bench

    cfg = config_from_args(args)
    print(f"--shape {args.shape}: {cfg.heads} query / {cfg.kv_heads} KV heads x "
          f"{cfg.head_dim}, {cfg.rounds} rounds", flush=True)
    res = run_attention_bench(cfg, log=lambda s: print(s, flush=True))
    res["shape"] = args.shape
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=2))
    print(f"({res['isa']} dispatch, {res['threads']} threads) wrote {args.json}")
    return 0
