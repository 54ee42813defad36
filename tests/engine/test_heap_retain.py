"""engine/memory.py retain_heap: freed step-sized buffers are reused instead of being
mapped, faulted in and unmapped again each step; the runner applies it from its config,
and the setting reaches it from the flag and the environment. mallopt is process-wide,
so faults are counted in child processes."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import engine.runner as runner_mod
from cli.main import CliError, build_parser
from cli.serve import settings_from_args
from engine.config import EngineConfig
from engine.memory import retain_heap
from engine.synth import SynthSpec, write_checkpoint
from tests.engine.test_model_support import make_runner, random_weights, tiny_config

REPO = str(Path(__file__).parents[2])

# A 20 MiB buffer malloc'ed, written and freed twice: page faults of the second round.
REUSE = textwrap.dedent("""
    import ctypes, resource, sys
    from engine.memory import retain_heap
    if int(sys.argv[1]):
        assert retain_heap(int(sys.argv[1]))
    libc = ctypes.CDLL("libc.so.6")
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, (ctypes.c_size_t,)
    libc.free.argtypes = (ctypes.c_void_p,)
    def round_trip(n=20 * 2**20):
        p = libc.malloc(n)
        ctypes.memset(p, 1, n)
        libc.free(p)
    round_trip()
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    round_trip()
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0)
""")


def _child(code: str, *args: str) -> str:
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True,
                         check=True, cwd=REPO)
    return out.stdout.strip().splitlines()[-1]


def test_freed_buffer_is_reused_without_faults() -> None:
    pages = 20 * 2**20 // 4096
    # glibc's defaults: the freed buffer was unmapped, its pages are faulted in again
    assert int(_child(REUSE, "0")) > 0.8 * pages
    # retained: the same pages come back
    assert int(_child(REUSE, str(256 * 2**20))) < 0.02 * pages


# The runner of a small synthetic checkpoint built with the given heap_retain_mib, then
# 512-token prefill steps: page faults per step once warm.
CHILD = textwrap.dedent("""
    import json, resource, sys
    from pathlib import Path
    from engine.batch import BatchInputs, SeqChunk
    from engine.config import EngineConfig
    from engine.runner import load_runner
    model, mib = Path(sys.argv[1]), int(sys.argv[2])
    runner = load_runner(model, EngineConfig(model, heap_retain_mib=mib, kv_cache_gib=0.05,
                                             max_model_len=1024))
    prompt = tuple(range(100, 612))
    blocks = tuple(range(-(-len(prompt) // runner.block_size)))
    batch = BatchInputs((SeqChunk(0, prompt, 0, blocks),))
    for _ in range(2):
        runner.run(batch)
    f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        runner.run(batch)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0) / 4
    print(json.dumps({"faults_per_step": faults}))
""")


@pytest.fixture(scope="module")
def small_model(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("heap-model")
    write_checkpoint(path, SynthSpec.preset("tiny", hidden_size=576, intermediate_size=1536,
                                            num_layers=8, num_heads=9, num_kv_heads=3,
                                            head_dim=64, vocab_size=8192))
    return path


def test_prefill_steps_barely_fault_when_retained(small_model: Path) -> None:
    # each 512-token step allocates ~60 MiB of activations (~15k pages); under glibc's
    # defaults 37-16k of them faulted per step across 16 processes (the heap's history
    # decides), retained 0-350 across 19
    faults = json.loads(_child(CHILD, str(small_model), "256"))["faults_per_step"]
    assert faults < 1500, faults


def test_retain_heap_refuses_nothing_to_retain() -> None:
    assert retain_heap(0) is False


def test_runner_applies_its_config(monkeypatch) -> None:
    calls: list[int] = []
    monkeypatch.setattr(runner_mod, "retain_heap", lambda n: calls.append(n) or True)
    weights = random_weights(tiny_config())
    make_runner(weights, heap_retain_mib=64)
    assert calls == [64 * 2**20]
    make_runner(weights, heap_retain_mib=0)  # 0: the C library's defaults, no call
    assert calls == [64 * 2**20]


def test_flag_env_default_and_validation(monkeypatch) -> None:
    def settings(argv: list[str]):
        return settings_from_args(build_parser().parse_args(["serve", *argv]))

    monkeypatch.delenv("FP8SERVE_HEAP_RETAIN_MIB", raising=False)
    assert settings([]).heap_retain_mib == 256
    assert settings(["--heap-retain-mib", "0"]).heap_retain_mib == 0
    monkeypatch.setenv("FP8SERVE_HEAP_RETAIN_MIB", "128")
    assert settings([]).heap_retain_mib == 128
    with pytest.raises(CliError, match="--heap-retain-mib -1: "):
        settings(["--heap-retain-mib", "-1"])
    with pytest.raises(ValueError, match="heap_retain_mib"):
        EngineConfig(model_dir=Path("."), heap_retain_mib=-1)
