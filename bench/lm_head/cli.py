"""`fp8serve bench lm-head`: the FP8 lm_head (quantized at load, per output channel)
against the bf16 head over the same decoder in one process: KL divergence and top-1
agreement of the logits on real hidden states, greedy agreement over long generations,
and decode speed in interleaved rounds (bench/lm_head/run.py). Prints a summary
and writes JSON."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.common.errors import BenchError
from bench.common.flags import require_at_least


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("lm-head", help="FP8 vs bf16 lm_head: KL, top-1, greedy, decode speed")
    p.add_argument("--model", type=Path, default=None,
                   help="checkpoint directory (default: the demo model)")
    p.add_argument("--prompts", type=int, default=6, help="prompts (built-in texts)")
    p.add_argument("--random-prompts", action="store_true",
                   help="random token ids instead of texts (e.g. random-weight checkpoints)")
    p.add_argument("--kl-tokens", type=int, default=64,
                   help="greedy tokens appended to each prompt for the logit rows")
    p.add_argument("--greedy-tokens", type=int, default=256)
    p.add_argument("--speed-rounds", type=int, default=3)
    p.add_argument("--speed-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--json", type=Path, default=Path("bench/results/lm-head.json"))
    p.set_defaults(func=run)


def config_from_args(args: argparse.Namespace) -> Any:
    from bench.lm_head.run import LmHeadBenchConfig
    from engine.demo_model import ensure_demo_model

    require_at_least(args, 1, "--prompts", "--kl-tokens", "--greedy-tokens",
                     "--speed-rounds", "--speed-tokens")
    if args.model is not None and not args.model.is_dir():
        raise BenchError(f"--model {args.model}: not a directory")
    try:
        return LmHeadBenchConfig(
            model_dir=ensure_demo_model() if args.model is None else args.model,
            kl_tokens=args.kl_tokens, greedy_tokens=args.greedy_tokens,
            num_prompts=args.prompts, random_prompts=args.random_prompts,
            speed_rounds=args.speed_rounds, speed_tokens=args.speed_tokens,
            threads=args.threads)
    except ValueError as exc:
        raise BenchError(str(exc)) from exc


def format_summary(res: dict[str, Any]) -> str:
    m, acc, sp = res["model"], res["accuracy"], res["speed"]
    lg, c = acc["logits"], res["config"]
    lines = [
        f"{m['name']}: vocab {m['vocab_size']} x hidden {m['hidden_size']}, "
        f"{res['threads']} threads; bf16 head {res['bf16_head']}, fp8 head on "
        f"{res['fp8_head_kernel']} ({res['head_bytes']['fp8'] / 2**20:.1f} MiB vs "
        f"{res['head_bytes']['bf16'] / 2**20:.1f} MiB bf16)",
        f"logits over {lg['rows']} positions: KL(bf16 || fp8) mean {lg['kl_mean']:.2e}, "
        f"p99 {lg['kl_p99']:.2e}, max {lg['kl_max']:.2e}; top-1 agreement {lg['top1']:.4f}",
        f"greedy {c['greedy_tokens']} tokens x {len(acc['greedy'])} prompts: leading "
        f"agreement {[g['leading_agree'] for g in acc['greedy']]} (mean "
        f"{acc['greedy_leading_mean']:.1f}); all {c['greedy_tokens']} equal in "
        f"{acc['greedy_all_equal']} of {len(acc['greedy'])}",
        "decode tok/s per round: bf16 " + ", ".join(f"{x:.1f}" for x in sp["decode_tok_s"]["bf16"])
        + "; fp8 " + ", ".join(f"{x:.1f}" for x in sp["decode_tok_s"]["fp8"]),
        f"fp8 / bf16 decode: best round of each {sp['decode_ratio_best']:.3f}x, median of "
        f"per-round ratios {sp['decode_ratio_median']:.3f}x (rounds "
        + ", ".join(f"{x:.3f}" for x in sp["decode_ratio_fp8_over_bf16"]) + ")",
        f"head alone at M=1: bf16 {min(sp['head_ms']['bf16']):.3f} ms, fp8 "
        f"{min(sp['head_ms']['fp8']):.3f} ms (best); speedup median "
        f"{sp['head_speedup_median']:.2f}x",
    ]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    from bench.lm_head.run import run_lm_head_bench

    res = run_lm_head_bench(config_from_args(args), log=lambda s: print(s, flush=True))
    print(format_summary(res))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=2))
    print(f"wrote {args.json}")
    return 0
