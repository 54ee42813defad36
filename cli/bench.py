"""`fp8serve bench <name>`: each benchmark (kernels, generate, serve, rss, gpu-kernels,
lm-head, structured, vision, kv-cache) is its own module."""

from __future__ import annotations

import argparse
import importlib

BENCH_MODULES = ("cli.bench_kernels", "cli.bench_generate", "cli.bench_serve", "cli.bench_rss",
                 "cli.bench_gpu_kernels", "cli.bench_lm_head", "cli.bench_structured",
                 "cli.bench_vision", "cli.bench_kv_cache")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks that print ratios against same-run baselines")
    bench_sub = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for name in BENCH_MODULES:
        importlib.import_module(name).register(bench_sub)
