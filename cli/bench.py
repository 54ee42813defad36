"""`fp8serve bench <name>`: each benchmark (kernels, generate, serve, rss, gpu-kernels,
lm-head, structured, vision, kv-cache, llamacpp) is its own command module under bench/ (its
``register(subparsers)``); this module only gathers them, and turns their BenchError into
the CliError that `fp8serve` prints as one line."""

from __future__ import annotations

import argparse
import functools
from collections.abc import Callable
from types import ModuleType

from bench.common.errors import BenchError
from bench.generate import cli as generate
from bench.kernels import cli as kernels
from bench.kernels import gpu_cli as gpu_kernels
from bench.kv_cache import cli as kv_cache
from bench.llamacpp import cli as llamacpp
from bench.lm_head import cli as lm_head
from bench.rss import cli as rss
from bench.serve import cli as serve
from bench.structured import cli as structured
from bench.vision import cli as vision
from cli.main import CliError

BENCH_COMMANDS: tuple[ModuleType, ...] = (kernels, generate, serve, rss, gpu_kernels, lm_head,
                                          structured, vision, kv_cache, llamacpp)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks that print ratios against same-run baselines")
    bench_sub = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for module in BENCH_COMMANDS:
        module.register(bench_sub)
    for parser in bench_sub.choices.values():
        parser.set_defaults(func=_as_cli_error(parser.get_default("func")))


def _as_cli_error(func: Callable[[argparse.Namespace], int]
                  ) -> Callable[[argparse.Namespace], int]:
    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        try:
            return func(args)
        except BenchError as exc:
            raise CliError(str(exc), exc.exit_code) from exc

    return run
