"""The command-line spelling of settings that several commands share (`fp8serve serve`,
`generate`, `kernels` and the benchmarks under bench/): argparse helpers whose choices come
from engine.config, so every command offers the same values with the same help."""

from __future__ import annotations

import argparse
import json
import os
from decimal import Decimal, InvalidOperation


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask; os.cpu_count() where it has none)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def threads_problem(threads: int) -> str | None:
    """Why a thread count (`serve --threads` / FP8SERVE_THREADS,
    --vision-encoder-threads, `generate --threads`) cannot be used, or None: more threads
    than the CPUs this process may run on (the kernels split each layer over every thread
    and wait for the slowest, so a thread without a core of its own slows every step).
    Every command that takes it applies this check, with this message."""
    cpus = usable_cpus()
    if threads > cpus:
        return f"{threads} threads, but this process may use {cpus} CPUs"
    return None


def add_lm_head_arg(parser: argparse.ArgumentParser) -> None:
    """--lm-head-dtype auto|bf16|fp8 (None when not given, so FP8SERVE_LM_HEAD_DTYPE can
    apply to `serve`; everywhere else None means auto)."""
    from engine.config import LM_HEAD_DTYPES

    parser.add_argument("--lm-head-dtype", choices=LM_HEAD_DTYPES, default=None,
                        help="lm_head weights: auto (the checkpoint's dtype, default), bf16, "
                             "or fp8 (a bf16 head quantized at load, per output channel, "
                             "run on the FP8 kernels)")


def add_kv_cache_dtype_arg(parser: argparse.ArgumentParser) -> None:
    """--kv-cache-dtype auto|bf16|fp8 (vLLM's flag; None when not given, so
    FP8SERVE_KV_CACHE_DTYPE can apply to `serve`; everywhere else None means auto)."""
    from engine.config import KV_CACHE_DTYPES

    parser.add_argument("--kv-cache-dtype", choices=KV_CACHE_DTYPES, default=None,
                        help="K/V cache element type: auto (= bf16, default), bf16, or fp8 "
                             "(e4m3 with an fp32 scale per token and KV head, or the "
                             "checkpoint's static k_scale / v_scale): about 1.9x the "
                             "tokens per --kv-cache-gib")


_UNITS = {"k": 10**3, "m": 10**6, "g": 10**9, "K": 2**10, "M": 2**20, "G": 2**30}


def human_int(text: str) -> int:
    """vLLM's token counts: an integer, or one with a unit, k/m/g decimal and K/M/G
    binary ("32k" = 32000, "32K" = 32768, "25.6k" = 25600); a fraction that is not a
    whole number of tokens is refused."""
    s = str(text).strip()
    unit = _UNITS.get(s[-1:], 1) if s else 1
    number = s[:-1] if unit != 1 else s
    try:
        value = Decimal(number) * unit if unit != 1 else Decimal(int(number))
    except (ValueError, InvalidOperation):
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number (units: k, m, g "
                                         "decimal; K, M, G binary)") from None
    if not value.is_finite() or value != value.to_integral_value():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of tokens")
    return int(value)


def parse_mm_limit(text: str) -> int:
    """vLLM's --limit-mm-per-prompt: 'image=N' or '{"image": N}' -> N."""
    try:
        value = json.loads(text) if text.lstrip().startswith("{") else dict(
            [p.split("=", 1) for p in text.split(",") if p.strip()])
        unknown = set(value) - {"image"}
        if unknown:
            raise ValueError(f"only image is supported, got {sorted(unknown)}")
        n = int(value.get("image", 0))
        if n < 0:
            raise ValueError("the count must be >= 0")
        return n
    except (ValueError, TypeError, AttributeError) as exc:
        raise argparse.ArgumentTypeError(f"--limit-mm-per-prompt {text!r}: {exc} "
                                         "(write image=N)") from None
