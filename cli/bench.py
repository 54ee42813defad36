"""`fp8serve bench <name>`: each benchmark (kernels, generate, serve, rss, gpu-kernels,
lm-head, structured, vision, kv-cache, attention, llamacpp, overhead) is its own command
module under bench/ (its ``register(subparsers)``); this module only gathers them, and turns
their BenchError into the CliError that `fp8serve` prints as one line."""

from __future__ import annotations

import argparse
import functools
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

from bench.attention import cli as attention
from bench.common.errors import BenchError
from bench.generate import cli as generate
from bench.kernels import cli as kernels
from bench.kernels import gpu_cli as gpu_kernels
from bench.kv_cache import cli as kv_cache
from bench.llamacpp import cli as llamacpp
from bench.lm_head import cli as lm_head
from bench.overhead import cli as overhead
from bench.rss import cli as rss
from bench.serve import cli as serve
from bench.structured import cli as structured
from bench.vision import cli as vision
from cli.main import CliError

BENCH_COMMANDS: tuple[ModuleType, ...] = (kernels, generate, serve, rss, gpu_kernels, lm_head,
                                          structured, vision, kv_cache, attention, llamacpp,
                                          overhead)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks that print ratios against same-run baselines")
    bench_sub = p.add_subparsers(dest="bench", required=True, metavar="BENCH")
    for module in BENCH_COMMANDS:
        module.register(bench_sub)
    for parser in bench_sub.choices.values():
        parser.set_defaults(func=_as_cli_error(parser.get_default("func")))


# Output-file flags the benchmarks share: checked before a run that may take hours, so a
# path that cannot be written fails at once instead of after the measurements
OUTPUT_FLAGS = (("json", "--json"), ("json_out", "--json-out"), ("png", "--png"))


def check_common(args: argparse.Namespace) -> None:
    """The flags several benchmarks share, validated before anything is loaded."""
    threads = getattr(args, "threads", None)
    if threads is not None and threads < 1:
        raise CliError(f"--threads {threads}: must be >= 1")
    for attr, flag in OUTPUT_FLAGS:
        value = getattr(args, attr, None)
        if value:
            _check_writable(flag, Path(value))


def _check_writable(flag: str, path: Path) -> None:
    if path.is_dir():
        raise CliError(f"{flag} {path}: is a directory")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent  # the directories missing below it are created at the end
    if not parent.is_dir():
        raise CliError(f"{flag} {path}: {parent} is not a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise CliError(f"{flag} {path}: {parent} is not writable")


def _as_cli_error(func: Callable[[argparse.Namespace], int]
                  ) -> Callable[[argparse.Namespace], int]:
    @functools.wraps(func)
    def run(args: argparse.Namespace) -> int:
        from engine.checkpoint.errors import CheckpointError
        from engine.config import ConfigError
        from engine.demo_model import DemoModelError
        from engine.text.tokenizer import TokenizerLoadError

        check_common(args)
        try:
            return func(args)
        except BenchError as exc:
            raise CliError(str(exc), exc.exit_code) from exc
        except (CheckpointError, ConfigError, DemoModelError, TokenizerLoadError) as exc:
            # a --model that is no checkpoint, a setting the engine refuses: one line
            raise CliError(str(exc) or type(exc).__name__) from None

    return run
