"""bench/llamacpp/server.py: llama-server's command line, and the system_info line read
back from a llama.cpp log."""

from __future__ import annotations

from pathlib import Path

from bench.llamacpp.build import NativeBuild
from bench.llamacpp.server import server_command, simd_levels, system_info

LOG = ("build: 1 (abc) with cc for x86_64-linux-gnu\n"
       "system info: n_threads = 2, n_threads_batch = 2, total_threads = 2\n\n"
       "system_info: n_threads = 2 (n_threads_batch = 2) / 2 | CPU : SSE3 = 1 | SSSE3 = 1 "
       "| AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | AVX512 = 0 | LLAMAFILE = 1 | REPACK = 1 "
       "| \nmain: loading model\n")

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


def test_system_info_is_the_cpu_part_of_the_system_info_line():
    info = system_info(LOG)
    assert info == ("CPU : SSE3 = 1 | SSSE3 = 1 | AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1 | "
                    "AVX512 = 0 | LLAMAFILE = 1 | REPACK = 1")
    assert simd_levels(info) == ["SSE3", "SSSE3", "AVX", "AVX2", "F16C", "FMA", "LLAMAFILE",
                                 "REPACK"]
    assert system_info("no such line\n") is None
