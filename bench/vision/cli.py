"""`fp8serve bench vision --model DIR`: vision encode GFLOP/s against torch matmul on the
same host and moment, and (with --serving) TTFT of a one-image chat and the inter-token
latency of 4 streams while an image encodes (bench/vision/run.py)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path

from bench.common.errors import BenchError

SIZES = ("512x512", "1024x768", "1540x1540")


def _size(text: str) -> tuple[int, int]:
    try:
        w, h = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write WIDTHxHEIGHT") from None
    if w < 1 or h < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: width and height must be >= 1")
    return w, h


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("vision", help="vision encoder GFLOP/s; TTFT and ITL with an image")
    p.add_argument("--model", type=Path, required=True, help="multimodal checkpoint")
    p.add_argument("--sizes", type=_size, nargs="+", default=[_size(s) for s in SIZES],
                   metavar="WxH", help=f"images to encode (default {' '.join(SIZES)})")
    p.add_argument("--serving", action="store_true",
                   help="also TTFT of a one-image chat and ITL of 4 streams during an encode")
    p.add_argument("--compare-unfused", action="store_true",
                   help="also time the unfused tower beside the served one, alternating")
    p.add_argument("--rounds", type=int, default=2, help="rounds of --compare-unfused")
    p.add_argument("--serving-image", type=_size, default=(512, 512), metavar="WxH")
    p.add_argument("--vision-encoder-threads", type=int, nargs="+", default=None,
                   metavar="N", help="--serving: one encode per value beside the streams "
                   "(default: one, at the engine's thread count)")
    p.add_argument("--json", type=Path, default=Path("bench/results/vision.json"))
    p.set_defaults(func=run)


def _fusion(enc: object, w: int, h: int, rounds: int) -> dict[str, object]:
    from bench.vision.run import fusion_row

    r = fusion_row(enc, w, h, rounds)  # type: ignore[arg-type]
    gf = [f"{r.gflop / s:.1f}" for s in r.fused_s]
    gu = [f"{r.gflop / s:.1f}" for s in r.unfused_s]
    mm = [f"{x:.1f}" for x in r.fp32_matmul_gflops]
    print(f"{w}x{h}: fused GFLOP/s {' '.join(gf)} | unfused {' '.join(gu)} | torch fp32 mm "
          f"{' '.join(mm)} | unfused/fused time {r.speedup:.3f} (median of {rounds}); "
          f"max |fused - unfused| {r.max_abs_diff:g}", flush=True)
    return {**asdict(r), "speedup": r.speedup}


def run(args: argparse.Namespace) -> int:
    from bench.vision.run import encode_row, serving_latency
    from engine.vision.encoder import load_vision_encoder

    if args.rounds < 1:
        raise BenchError(f"--rounds {args.rounds}: must be >= 1")
    enc = load_vision_encoder(args.model)
    if enc is None:
        raise BenchError(f"--model {args.model}: no vision tower")
    print(f"vision GEMMs: {enc.gemm.mode} ({enc.gemm.why})")
    print(f"{'image':>10} {'tokens':>6} {'s':>7} {'GFLOP':>8} {'GFLOP/s':>8} "
          f"{'bf16 mm':>8} {'fp32 mm':>8} {'ratio':>6}")
    rows = []
    for w, h in args.sizes:
        r = encode_row(enc, w, h)
        rows.append({**asdict(r), "ratio": r.ratio})
        print(f"{w}x{h:<5} {r.image_tokens:6d} {r.seconds:7.1f} {r.gflop:8.0f} "
              f"{r.gflops:8.1f} {r.bf16_matmul_gflops:8.1f} {r.fp32_matmul_gflops:8.1f} "
              f"{r.ratio:6.2f}", flush=True)
    print("(s: encode wall time, preprocessing to projector; GFLOP: the encode's work; "
          "GFLOP/s: the encoder's rate; bf16 mm, fp32 mm: torch matmul GFLOP/s at the "
          "tower's main GEMM shape, timed beside it; ratio: the encoder's GFLOP/s / the "
          "faster torch matmul's, > 1 faster)")
    result = {"model": str(args.model), "gemm": enc.gemm.mode, "gemm_choice": enc.gemm.why,
              "encode": rows}
    if args.compare_unfused:
        result["fusion"] = [_fusion(enc, w, h, args.rounds) for w, h in args.sizes]
    if args.serving:
        del enc
        threads = tuple(args.vision_encoder_threads or (None,))
        if min((t for t in threads if t is not None), default=1) < 1:
            raise BenchError("--vision-encoder-threads: each N must be >= 1")
        result["serving"] = serving_latency(args.model, args.serving_image,
                                            encoder_threads=threads)
        print(json.dumps(result["serving"], indent=2))
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=2))
    print(f"wrote {args.json}")
    return 0
