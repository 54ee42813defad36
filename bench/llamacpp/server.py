"""`llama-server` from the host's llama.cpp build (build.py) as a benchmark's baseline
server: its command line."""

from __future__ import annotations

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
