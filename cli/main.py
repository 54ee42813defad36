"""`fp8serve` command line. Each subcommand lives in its own module under cli/ and exposes
``register(subparsers)``, which adds its parser and sets ``func(args) -> int``. Modules
import heavy dependencies (torch, the engine) inside ``func``, so ``--help`` stays fast."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

SUBCOMMAND_MODULES = (
    "cli.serve",
    "cli.generate",
    "cli.kernels",
    "cli.demo_model",
    "cli.synth_model",
    "cli.build_ext",
    "cli.bench",
)


class CliError(Exception):
    """A user-facing failure: printed as one line, exit status 1 (or .exit_code)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def dashed(argv: list[str]) -> list[str]:
    """Flags spelled with underscores (``--tokenizer_mode``, as vLLM takes them) in their
    dashed form; values and everything else as given."""
    out = []
    for a in argv:
        if a.startswith("--"):
            name, eq, value = a.partition("=")
            a = name.replace("_", "-") + eq + value
        out.append(a)
    return out


class _Parser(argparse.ArgumentParser):
    """Takes flags spelled with underscores too (see dashed)."""

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def]
        argv = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args(dashed(argv), namespace)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fp8serve", description="Serve FP8 Ministral-3 models on CPUs.")
    parser.add_argument("--log-level", default="INFO", help="DEBUG, INFO, WARNING, ERROR")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"fp8serve: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    # `python -m cli.main`: run the copy imported as cli.main, so the CliError that
    # subcommands import is the class caught here.
    from cli.main import main as _main

    sys.exit(_main())
