"""Range checks of the benchmarks' numeric flags, made before anything is loaded or
started: the error names the flag and the value given (``--num-prompts 0: must be >= 1``),
never the config field behind it (the configs keep their own checks for callers that
build them directly)."""

from __future__ import annotations

import argparse
from collections.abc import Iterable

from bench.common.errors import BenchError


def _values(args: argparse.Namespace, flag: str) -> Iterable[float]:
    """The flag's value (each of a list's), None left out; read from args as argparse
    stores it (``--num-prompts`` -> args.num_prompts)."""
    value = getattr(args, flag.lstrip("-").replace("-", "_"), None)
    return [v for v in (value if isinstance(value, (list, tuple)) else [value])
            if v is not None]


def require_at_least(args: argparse.Namespace, minimum: int, *flags: str) -> None:
    """BenchError ``FLAG V: must be >= minimum`` for the first value below ``minimum``."""
    for flag in flags:
        for v in _values(args, flag):
            if v < minimum:
                raise BenchError(f"{flag} {v}: must be >= {minimum}")


def require_positive(args: argparse.Namespace, *flags: str) -> None:
    """BenchError ``FLAG V: must be > 0`` for the first value that is not above 0."""
    for flag in flags:
        for v in _values(args, flag):
            if not v > 0:
                raise BenchError(f"{flag} {v:g}: must be > 0")
