"""`fp8serve bench gpu-kernels`: the CUDA FP8 kernels vs torch BF16 matmul and the HBM
read-bandwidth bound on the device, Ministral-3-8B linear shapes
(bench/kernels/gpu.py). Needs a CUDA device."""

from __future__ import annotations

import argparse


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gpu-kernels", help="CUDA FP8 kernels vs same-run baselines (GPU hosts)")
    p.add_argument("--ms", type=int, nargs="+", default=[1, 16, 128, 512, 2048])
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--cuda-graphs", action="store_true",
                   help="replay each call from a CUDA graph: device time, no launch overhead")
    p.add_argument("--json", help="write the result here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bench.kernels import gpu as gpu_kernel_bench

    argv = ["--ms", *map(str, args.ms), "--reps", str(args.reps)]
    argv += ["--cuda-graphs"] if args.cuda_graphs else []
    argv += ["--json", args.json] if args.json else []
    gpu_kernel_bench.main(argv)
    return 0
