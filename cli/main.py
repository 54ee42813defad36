"""`fp8serve` command line. Each subcommand lives in its own module under cli/ and exposes
``register(subparsers)``, which adds its parser and sets ``func(args) -> int``. Modules
import heavy dependencies (torch, the engine) inside ``func``, so ``--help`` stays fast."""

from __future__ import annotations

import argparse
import difflib
import importlib
import logging
import os
import sys
from collections.abc import Iterator
from typing import NoReturn

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
    """Takes flags spelled with underscores too (see dashed). A command line it refuses is
    two lines: the error (with the nearest flag for an unknown one) and where the flags
    are listed, not the command's whole usage (serve's runs to 45 lines above the error).
    A flag is taken whole only: argparse's prefixes (``--max-num 4`` for ``--max-num-seqs``)
    are refused, so a typo never lands on the flag it happens to begin, and a new flag
    never turns an old command line ambiguous. Subcommands' parsers are of this class."""

    def __init__(self, *args, allow_abbrev: bool = False, **kwargs):  # type: ignore[no-untyped-def]
        super().__init__(*args, allow_abbrev=allow_abbrev, **kwargs)

    def parse_known_args(self, args=None, namespace=None):  # type: ignore[no-untyped-def]
        argv = sys.argv[1:] if args is None else list(args)
        return super().parse_known_args(dashed(argv), namespace)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message}{nearest_flags(self, message)}\n"
                     f"{self.prog}{'' if self._subparsers is None else ' COMMAND'} --help "
                     "lists the flags\n")


def nearest_flags(parser: argparse.ArgumentParser, message: str) -> str:
    """' (did you mean --max-num-seqs?)' for the unknown flags of an argparse error, from
    the flags of ``parser`` and its subcommands ('' when none is near)."""
    if not message.startswith("unrecognized arguments: "):
        return ""
    known = {o for p in (parser, *_commands(parser)) for a in p._actions
             for o in a.option_strings if o.startswith("--")}
    near = [m for word in message.split()[2:] if word.startswith("--")
            for m in difflib.get_close_matches(word.split("=")[0], sorted(known), n=1)]
    return f" (did you mean {', '.join(dict.fromkeys(near))}?)" if near else ""


LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
LOG_LEVEL_HELP = ("DEBUG, INFO, WARNING, ERROR (default INFO, or FP8SERVE_LOG_LEVEL); "
                  "before or after the command")


def _commands(parser: argparse.ArgumentParser) -> Iterator[argparse.ArgumentParser]:
    """Every subcommand's parser below ``parser`` (``bench generate`` included)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for command in action.choices.values():
                yield command
                yield from _commands(command)


def add_log_level(parser: argparse.ArgumentParser) -> None:
    """``--log-level`` before the command (``fp8serve --log-level DEBUG serve``) or after
    it (``fp8serve serve --log-level DEBUG``; that one wins); FP8SERVE_LOG_LEVEL sets the
    default as every serve flag's variable does."""
    default = os.environ.get("FP8SERVE_LOG_LEVEL", "INFO").upper()
    if default not in LOG_LEVELS:
        raise CliError(f"FP8SERVE_LOG_LEVEL={default!r}: one of {', '.join(LOG_LEVELS)}")
    parser.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS, default=default,
                        help=LOG_LEVEL_HELP)
    for command in _commands(parser):
        command.add_argument("--log-level", type=str.upper, choices=LOG_LEVELS,
                             default=argparse.SUPPRESS, help=LOG_LEVEL_HELP)


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="fp8serve", description="Serve FP8 Ministral-3 models on CPUs.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name in SUBCOMMAND_MODULES:
        importlib.import_module(name).register(sub)
    add_log_level(parser)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        parser = build_parser()
    except CliError as exc:
        print(f"fp8serve: error: {exc}", file=sys.stderr)
        return exc.exit_code
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    try:
        return int(args.func(args) or 0)
    except CliError as exc:
        print(f"fp8serve: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # `fp8serve kernels | head`: the reader left; no traceback
        try:
            sys.stdout.flush()
        except BrokenPipeError:  # it was stdout's reader (not a socket of the command)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141
        raise


if __name__ == "__main__":
    # `python -m cli.main`: run the copy imported as cli.main, so the CliError that
    # subcommands import is the class caught here.
    from cli.main import main as _main

    sys.exit(_main())
