"""`fp8serve bench kernels`: FP8 kernels vs torch BF16 matmul, torch._scaled_mm and the
memory-bandwidth bound, on the Ministral-3-8B linear shapes (bench/kernels/cpu.py).
Prints a table, writes JSON and (with matplotlib) a PNG."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from bench.common.errors import BenchError

SHAPE_ALIASES = {"qo": "q_proj/o_proj", "kv": "k_proj/v_proj", "gate_up": "gate_proj/up_proj",
                 "down": "down_proj"}


LEGEND = ("(ms: median time of one call; GB/s: weight bytes read / time; TFLOP/s: 2*M*N*K / "
          "time; x bf16, x smm: torch bf16 matmul's / torch._scaled_mm's time over this "
          "kernel's, > 1 faster; % bound: the FP8 weight's read time at the measured "
          "bandwidth / this time)")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("kernels", help="FP8 GEMM/GEMV kernels vs same-run baselines")
    p.add_argument("--shapes", default="qo,kv,gate_up,down",
                   help="comma list of qo, kv, gate_up, down and/or NxK (e.g. 256x512)")
    p.add_argument("--m", default="1,8,32,128,512", help="comma list of M (tokens)")
    p.add_argument("--kernels", default=None,
                   help="comma list of kernel ids (default: every CPU kernel this host runs)")
    p.add_argument("--scale-kind", choices=("per_tensor", "per_channel", "block"),
                   default="per_tensor", help="block: 128 x 128 blocks")
    p.add_argument("--reps", type=int, default=20, help="timed calls per point (at most)")
    p.add_argument("--scaled-mm-m", default="1,32",
                   help="M values at which torch._scaled_mm runs (it is slow; '' = none)")
    p.add_argument("--max-seconds-per-call", type=float, default=5.0,
                   help="leave out (and list as skipped) an M at which one call would take "
                   "longer, from a smaller M's time (torch._scaled_mm is a reference loop "
                   "on some hosts)")
    p.add_argument("--json", type=Path, default=Path("bench/results/kernels.json"),
                   help="where the results go (default bench/results/kernels.json, beside "
                   "the other benchmarks')")
    p.add_argument("--png", type=Path, default=Path("bench/results/kernels.png"),
                   help="the chart, where matplotlib is installed (default "
                   "bench/results/kernels.png)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads every kernel and baseline runs on, as a server's "
                   "--threads sets them (default: torch's, all cores)")
    p.add_argument("--quick", action="store_true",
                   help="smoke run: first two M values, 3 reps, small bandwidth probe")
    p.set_defaults(func=run)


def _ints(text: str, flag: str) -> tuple[int, ...]:
    try:
        return tuple(int(v) for v in text.split(",") if v.strip())
    except ValueError as exc:
        raise BenchError(f"{flag}: expected a comma list of integers, got {text!r}") from exc


def parse_shapes(text: str) -> tuple[Any, ...]:
    from bench.kernels.cpu import MINISTRAL_3_8B, Shape

    by_name = {s.name: s for s in MINISTRAL_3_8B}
    out = []
    for item in (v.strip() for v in text.split(",") if v.strip()):
        if item in SHAPE_ALIASES:
            out.append(by_name[SHAPE_ALIASES[item]])
            continue
        n, _, k = item.lower().partition("x")
        if not (n.isdigit() and k.isdigit() and int(n) > 0 and int(k) > 0):
            raise BenchError(f"--shapes: {item!r} is neither {sorted(SHAPE_ALIASES)} nor NxK")
        out.append(Shape(item, int(n), int(k)))
    if not out:
        raise BenchError("--shapes: nothing to run")
    return tuple(out)


def config_from_args(args: argparse.Namespace) -> Any:
    from bench.kernels.cpu import KernelBenchConfig
    from engine.kernels.base import ScaleKind
    from engine.kernels.registry import KERNEL_CLASSES

    kernels = None
    if args.kernels:
        kernels = tuple(k.strip() for k in args.kernels.split(",") if k.strip())
        unknown = sorted(set(kernels) - set(KERNEL_CLASSES))
        if unknown:
            raise BenchError(f"--kernels: unknown kernel id(s) {unknown}")
    ms, smm_ms = _ints(args.m, "--m"), _ints(args.scaled_mm_m, "--scaled-mm-m")
    if not ms:
        raise BenchError("--m: no M values given")
    for flag, values in (("--m", ms), ("--scaled-mm-m", smm_ms)):
        if min(values, default=1) < 1:
            raise BenchError(f"{flag}: M values must be >= 1, got {min(values)}")
    if args.reps < 1:
        raise BenchError(f"--reps {args.reps}: must be >= 1")
    try:
        cfg = KernelBenchConfig(shapes=parse_shapes(args.shapes), ms=ms,
                                kernels=kernels, scale_kind=ScaleKind(args.scale_kind),
                                reps=args.reps, scaled_mm_ms=smm_ms,
                                max_seconds_per_call=args.max_seconds_per_call,
                                threads=args.threads)
    except ValueError as exc:
        raise BenchError(str(exc)) from exc
    return cfg.quick() if args.quick else cfg


def run(args: argparse.Namespace, hw: Any = None) -> int:
    """``hw``: a HardwareInfo to use instead of probing this host (tests)."""
    from bench.kernels.cpu import run_kernel_bench
    from bench.kernels.plot import plot_rows
    from bench.kernels.table import format_rows
    from engine.hardware_probe import probe_hardware

    cfg = config_from_args(args)
    hw = hw if hw is not None else probe_hardware()
    res = run_kernel_bench(cfg, hw, log=lambda s: print(s, flush=True))
    print(format_rows(res.rows))
    print(LEGEND)
    for s in res.skipped:
        print(f"skipped {s['kernel']} on {s['shape']}: {s['reason']}")
    for note in res.notes:
        print(f"note: {note}")
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(res.to_dict(), indent=2))
    print(f"wrote {args.json}")
    why_not = plot_rows(res.rows, args.png)
    print(f"wrote {args.png}" if why_not is None else f"plot: {why_not}")
    return 0
