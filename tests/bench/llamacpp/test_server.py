"""bench/llamacpp/server.py: llama-server's command line."""

from __future__ import annotations

from pathlib import Path

from bench.llamacpp.build import NativeBuild
from bench.llamacpp.server import server_command


def test_server_command_sizes_the_context_by_slots():
    build = NativeBuild(Path("/c/llama.cpp/v-k"), "v", "-march=native")
    cmd = server_command(build, Path("/m/w.gguf"), 8123, slots=16, ctx_per_slot=256,
                         threads=2)
    assert cmd[0] == "/c/llama.cpp/v-k/build/bin/llama-server"
    flags = dict(zip(cmd[1::2], cmd[2::2], strict=False))
    assert flags["--model"] == "/m/w.gguf" and flags["--port"] == "8123"
    assert (flags["--parallel"], flags["--ctx-size"]) == ("16", str(16 * 256))
    assert (flags["--threads"], flags["--threads-batch"]) == ("2", "2")
    assert flags["--host"] == "127.0.0.1" and cmd[-1] == "--no-webui"

