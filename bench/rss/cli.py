"""`fp8serve bench rss --model DIR --kv-cache-gib G`: start `fp8serve serve` in a
subprocess, send a few requests, and report its peak RSS (VmHWM) against the weight bytes
on disk of what it loaded (the vision tower too when it serves images;
--limit-mm-per-prompt image=0 skips it, as for serve) plus the KV budget
(bench/rss/run.py)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.common.errors import BenchError
from bench.common.flags import require_at_least, require_positive
from engine.config_flags import parse_mm_limit


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("rss", help="peak RSS of the server vs weights + KV budget")
    p.add_argument("--model", type=Path, default=None,
                   help="checkpoint directory (default: the demo model, converted once)")
    p.add_argument("--kv-cache-gib", type=float, default=1.0)
    p.add_argument("--max-num-seqs", type=int, default=16)
    p.add_argument("--max-model-len", type=int, default=4096)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--limit-mm-per-prompt", type=parse_mm_limit, default=None,
                   metavar="image=N", help="passed to serve (image=0: no vision tower)")
    p.add_argument("--requests", type=int, default=8)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=128)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--json", type=Path, default=Path("bench/results/rss.json"))
    p.set_defaults(func=run)


def format_summary(res: dict[str, Any]) -> str:
    w, gib = res["weight_bytes"], 2**30
    base = res["interpreter_baseline"].get("VmHWM", 0) / gib
    after = res["memory"]["after_requests"]
    v = res["vision"]
    tower = (f"loaded, {w['vision'] / 2**20:.0f} MiB on disk counted" if v.get("images")
             else f"not loaded ({v.get('reason')})")
    return "\n".join([
        f"model {res['model']}: weights loaded {res['loaded_weight_bytes'] / gib:.2f} GiB "
        f"on disk (text decoder {w['text_decoder'] / gib:.2f} GiB; vision tower + "
        f"projector {w['vision'] / gib:.2f} GiB: {tower}) + KV "
        f"{res['kv_cache_bytes'] / gib:.2f} GiB = {res['budget_gib']:.2f} GiB",
        f"server peak RSS (VmHWM) {res['peak_rss_gib']:.2f} GiB: "
        f"{res['overhead_gib']:+.2f} GiB over weights + KV "
        f"({res['peak_vs_budget']:.2f}x); python+torch+service alone {base:.2f} GiB",
        f"resident after the requests: anonymous {after.get('RssAnon', 0) / gib:.2f} GiB, "
        f"file-backed (mapped checkpoint pages) {after.get('RssFile', 0) / gib:.2f} GiB",
        f"requests completed {res['requests']['completed']}, failed "
        f"{res['requests']['failed']}; ready in {res['ready_s']:.1f} s"])


def run(args: argparse.Namespace) -> int:
    import logging

    from bench.rss.run import RssBenchConfig, run_rss_bench

    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per request otherwise

    require_positive(args, "--kv-cache-gib")
    require_at_least(args, 1, "--requests", "--concurrency", "--prompt-len", "--max-tokens")
    model = args.model
    if model is None:
        from engine.demo_model import ensure_demo_model

        model = ensure_demo_model()
    elif not model.is_dir():
        raise BenchError(f"--model {model}: not a directory")
    try:
        cfg = RssBenchConfig(model_dir=model, kv_cache_gib=args.kv_cache_gib,
                             max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                             threads=args.threads,
                             limit_mm_per_prompt=getattr(args, "limit_mm_per_prompt", None),
                             requests=args.requests,
                             concurrency=args.concurrency, prompt_len=args.prompt_len,
                             max_tokens=args.max_tokens)
        res = run_rss_bench(cfg, log=lambda s: print(s, flush=True))
    except (ValueError, RuntimeError, TimeoutError) as exc:
        raise BenchError(str(exc)) from exc
    print(format_summary(res))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res, indent=2))
    print(f"wrote {args.json}")
    return 0 if res["requests"]["failed"] == 0 else 1
