"""`fp8serve bench kv-cache`: the FP8 (e4m3) KV cache against bf16 over one loaded model:
greedy agreement and KL over long generations, and decode tok/s at long contexts in
interleaved rounds (bench/kv_cache/run.py). Prints a summary and writes JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.common.errors import BenchError
from bench.common.flags import require_at_least


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("kv-cache", help="FP8 vs bf16 KV cache: greedy agreement, decode speed")
    p.add_argument("--model", type=Path, default=None,
                   help="checkpoint directory (default: the demo model)")
    p.add_argument("--contexts", default="512",
                   help="comma-separated context lengths for decode speed (keys attended)")
    p.add_argument("--speed-rounds", type=int, default=3)
    p.add_argument("--speed-tokens", type=int, default=8, help="decode steps per round")
    p.add_argument("--greedy-tokens", type=int, default=0,
                   help="greedy tokens per prompt for the accuracy part (0 = skip)")
    p.add_argument("--prompts", type=int, default=4)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--op-only", action="store_true",
                   help="time only the paged-attention op at the model's head shape (one "
                        "decode row per context, --speed-rounds reps per dtype, interleaved)")
    p.add_argument("--op-layers", type=int, default=1,
                   help="with --op-only: copies of the K/V called in turn per rep, as a "
                        "model's layers (enough of them keep the KV out of the CPU caches)")
    p.add_argument("--json", type=Path, default=Path("bench/results/kv-cache.json"))
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> Any:
    from bench.kv_cache.run import KvCacheBenchConfig
    from engine.demo_model import ensure_demo_model

    if args.model is not None and not args.model.is_dir():
        raise BenchError(f"--model {args.model}: not a directory")
    try:
        contexts = tuple(int(c) for c in args.contexts.split(",") if c.strip())
    except ValueError:
        raise BenchError(f"--contexts: expected a comma list of integers, got "
                         f"{args.contexts!r}") from None
    require_at_least(args, 1, "--speed-rounds", "--speed-tokens", "--prompts")
    require_at_least(args, 0, "--greedy-tokens")
    if any(c < 1 for c in contexts):
        raise BenchError(f"--contexts {args.contexts}: each context length must be >= 1")
    try:
        return KvCacheBenchConfig(
            model_dir=ensure_demo_model() if args.model is None else args.model,
            contexts=contexts, speed_rounds=args.speed_rounds,
            speed_tokens=args.speed_tokens, greedy_tokens=args.greedy_tokens,
            num_prompts=args.prompts, threads=args.threads)
    except ValueError as exc:
        raise BenchError(str(exc)) from exc


def format_summary(res: dict[str, Any]) -> str:
    b = res["kv_bytes_per_block"]
    lines = [f"{res['config']['model_dir']}: {res['threads']} threads; KV bytes per block "
             f"bf16 {b['bf16']}, fp8 {b['fp8']} ({b['bf16'] / b['fp8']:.2f}x the tokens)"]
    if "accuracy" in res:
        a = res["accuracy"]
        lines.append(f"greedy: leading agreement {[g['leading_agree'] for g in a['greedy']]} "
                     f"(mean {a['greedy_leading_mean']:.1f}), all equal in "
                     f"{a['greedy_all_equal']} of {len(a['greedy'])}; over {a['rows']} "
                     f"positions KL(bf16 || fp8) mean {a['kl_mean']:.2e}, p99 "
                     f"{a['kl_p99']:.2e}, max {a['kl_max']:.2e}, top-1 {a['top1']:.4f}")
        g = a["scale_granularity_rel_rms"]
        lines.append("e4m3 relative RMS error of the real K / V, scale per (token, head): "
                     f"{g['k_token']:.4f} / {g['v_token']:.4f}; per (block, head): "
                     f"{g['k_block']:.4f} / {g['v_block']:.4f}")
    for ctx, s in res["speed"].items():
        lines.append(f"context {ctx}: decode tok/s bf16 "
                     + ", ".join(f"{x:.2f}" for x in s["decode_tok_s"]["bf16"]) + "; fp8 "
                     + ", ".join(f"{x:.2f}" for x in s["decode_tok_s"]["fp8"])
                     + f"; fp8 / bf16 median {s['ratio_median']:.3f}x, best-of "
                     f"{s['ratio_best']:.3f}x")
    return "\n".join(lines)


def format_op(res: dict[str, Any]) -> str:
    lines = [f"paged_attention alone ({res.get('isa', '?')} dispatch), {res['heads']} query "
             f"/ {res['kv_heads']} KV heads x {res['head_dim']}, one decode row, "
             f"{res['threads']} threads, {res.get('layers', 1)} K/V copies per rep"]
    for ctx, r in res.items():
        if not isinstance(r, dict):
            continue
        for n in ("bf16", "fp8"):
            best = min(r["seconds"][n])
            lines.append(f"{ctx} keys {n}: best {best * 1e3:.1f} ms, K/V "
                         f"{r['kv_bytes'][n] / 1e6:.1f} MB -> "
                         f"{r['kv_bytes'][n] / best / 1e9:.2f} GB/s")
        lines.append(f"{ctx} keys fp8 / bf16 time per rep: "
                     + ", ".join(f"{x:.2f}" for x in r["ratio_per_rep"]))
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from bench.kv_cache.run import attention_op_speed, run_kv_cache_bench

    if getattr(args, "op_only", False):
        cfg = config_from_args(args)
        layers = getattr(args, "op_layers", 1)
        if layers < 1:
            raise BenchError(f"--op-layers {layers}: must be >= 1")
        res = attention_op_speed(cfg.model_dir, cfg.contexts, cfg.speed_rounds, cfg.threads,
                                 layers)
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(res, indent=2))
        print(format_op(res))
        return 0
    res = run_kv_cache_bench(config_from_args(args), log=lambda s: print(s, flush=True))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=2))
    print(format_summary(res))
    return 0
