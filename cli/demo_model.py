"""`fp8serve demo-model [DIR]`: convert the built-in demo model (SmolLM2-135M-Instruct GGUF
-> Ministral-3 FP8 checkpoint) once, into DIR or the cache directory, and print its path."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo-model", help="prepare the built-in FP8 demo model (converted once)")
    p.add_argument("dir", nargs="?", type=Path, default=None,
                   help="output directory (default: $FP8SERVE_CACHE_DIR/demo-smollm2-135m-fp8, "
                        "FP8SERVE_CACHE_DIR defaulting to $XDG_CACHE_HOME/fp8serve or "
                        "~/.cache/fp8serve)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from cli.main import CliError
    from engine.demo_model import DemoModelError, ensure_demo_model

    try:
        path = ensure_demo_model(args.dir)
    except (DemoModelError, OSError, ImportError) as exc:
        raise CliError(f"demo model: {exc}") from None
    print(path)
    return 0
