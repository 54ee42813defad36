"""`fp8serve bench serve --llama-server`: starts fp8serve on the checkpoint and the host's
llama-server build on its GGUF (here a stand-in binary, fake_llama_server.py: the real
build takes an hour), drives both interleaved, reports the pair with what llama.cpp was
compiled for, and stops both."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import httpx
import pytest

from bench.llamacpp import build as llama_build
from bench.llamacpp.build import NativeBuild
from bench.report.results import servers_section
from bench.serve.servers import context_per_sequence
from cli.main import main
from tests.bench.serve import fake_llama_server


@pytest.fixture
def fake_build(tmp_path, monkeypatch) -> NativeBuild:
    build = NativeBuild(tmp_path / "llama.cpp", "0.0-test", "-march=native")
    build.bin_dir.mkdir(parents=True)
    build.server.write_text(f"#!{sys.executable}\n"
                            + Path(fake_llama_server.__file__).read_text())
    build.server.chmod(0o755)
    monkeypatch.setattr(llama_build, "ensure_native", lambda hw, log=print: build)
    monkeypatch.setattr(llama_build, "system_info", lambda lib_dir: "CPU : AVX2 = 1 | FAKE = 1")
    return build


@pytest.mark.slow
def test_drives_fp8serve_and_llama_server_and_stops_both(tiny_checkpoint, fake_build, tmp_path,
                                                          capsys):
    model = tiny_checkpoint(vocab_size=131072, tokenizer=True)
    gguf = tmp_path / "weights.Q8_0.gguf"
    gguf.write_bytes(b"GGUF")
    out = tmp_path / "llama-serve-x.json"
    rc = main(["bench", "serve", "--llama-server", "--model-dir", str(model), "--gguf",
               str(gguf), "--threads", "1", "--server-arg=--max-model-len=512",
               "--server-arg=--kv-cache-gib=0.05", "--concurrency", "1", "2",
               "--num-prompts", "2", "--input-len", "8", "--output-len", "4",
               "--rounds", "2", "--json-out", str(out)])
    assert rc == 0
    data = json.loads(out.read_text())
    rows = data["comparison"]["servers"]
    assert [r["concurrency"] for r in rows] == [1, 2]
    ours, theirs = rows[0]["url"], rows[0]["compare_url"]
    assert data["servers"][ours]["name"] == "fp8serve"
    other = data["servers"][theirs]
    assert other["name"] == "llama-server (weights.Q8_0.gguf)"
    assert other["system_info"] == "CPU : AVX2 = 1 | FAKE = 1"
    assert (other["threads"], other["llama_cpp"], other["gguf"]) == (1, "0.0-test", str(gguf))
    for run in data["runs"]:
        assert (run["completed"], run["failed"], run["total_output_tokens"]) == (2, 0, 8)
        assert run["cached_tokens"] == 0  # no pass repeats a prompt llama-server has seen
    text = capsys.readouterr().out
    assert "server vs server: fp8serve / llama-server (weights.Q8_0.gguf)" in text
    assert "llama-server 0.0-test (-march=native): CPU : AVX2 = 1 | FAKE = 1" in text
    section = "\n".join(servers_section(data, "x"))
    assert "| 1 | " in section and "| 2 | " in section and "FAKE = 1" in section
    for url in (ours, theirs):
        with pytest.raises(httpx.HTTPError):
            httpx.get(url + "/health", timeout=2)


def test_refuses_workloads_with_cache_passes(fake_build, capsys):
    rc = main(["bench", "serve", "--llama-server", "--workload", "multi-turn"])
    assert rc != 0
    assert "--llama-server: only the random workload" in capsys.readouterr().err


@pytest.mark.parametrize(("workload", "want"), [("random", 8 + 4 + 64),
                                                ("shared-prefix", 100 + 8 + 4 + 64),
                                                ("multi-turn", 100 + 3 * (8 + 4) + 64)])
def test_each_slot_holds_the_longest_sequence_of_the_workload(workload, want):
    args = argparse.Namespace(workload=workload, system_len=100, turns=3, input_len=8,
                              output_len=4)
    assert context_per_sequence(args) == want


def test_a_killed_benchmark_leaves_no_server_behind(tmp_path):
    """The servers start with PR_SET_PDEATHSIG: SIGKILL the parent, the child goes."""
    import os
    import signal
    import subprocess
    import time

    script = ("import subprocess, sys, time\n"
              "from bench.serve.servers import _die_with_parent\n"
              "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'],"
              " preexec_fn=_die_with_parent)\n"
              "print(child.pid, flush=True)\n"
              "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              text=True, cwd=Path(__file__).parents[3])
    child = int(parent.stdout.readline())
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(child, signal.SIGKILL)
    pytest.fail("the child outlived its killed parent")
