"""`llama-server` from the host's llama.cpp build (build.py) as a benchmark's baseline
server: its command line, and the ``system_info`` line its log opens with (which SIMD
levels the build runs), read back for the report."""

from __future__ import annotations

import re
from pathlib import Path

from bench.llamacpp.build import NativeBuild


def server_command(build: NativeBuild, gguf: Path, port: int, slots: int, ctx_per_slot: int,
                   threads: int) -> list[str]:
    """llama-server on ``gguf`` at 127.0.0.1:``port`` with ``slots`` parallel sequences
    (continuous batching, its default), ``ctx_per_slot`` tokens of KV each, ``threads``
    threads for decode and prompt batches alike, no web UI."""
    return [str(build.server), "--model", str(gguf), "--host", "127.0.0.1", "--port",
            str(port), "--parallel", str(slots), "--ctx-size", str(slots * ctx_per_slot),
            "--threads", str(threads), "--threads-batch", str(threads), "--no-webui"]


SYSTEM_INFO = re.compile(r"system_info:.*?\|\s*(CPU\s*:.*?)\s*$", re.MULTILINE)


def system_info(log_text: str) -> str | None:
    """The ``CPU : SSE3 = 1 | AVX = 1 | ...`` part of the first system_info line of a
    llama.cpp log (None when absent)."""
    m = SYSTEM_INFO.search(log_text)
    return m.group(1).rstrip(" |") if m else None


def simd_levels(info: str) -> list[str]:
    """The features a system_info string marks ``= 1`` (e.g. ['AVX2', 'AVX512', ...])."""
    return re.findall(r"([A-Z0-9_]+)\s*=\s*1\b", info)
