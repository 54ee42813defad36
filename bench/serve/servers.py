"""The servers a serving benchmark starts itself (bench/serve/cli.py), each on a free port
with its own log, all stopped on exit: fp8serve with and without a speculative config
(``--speculative-config``), fp8serve with and without other serve flags
(``--compare-server-arg``), or fp8serve and llama.cpp's `llama-server` on the same weights
(``--llama-server``)."""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.common.errors import BenchError
from bench.common.server_process import free_port, stop, wait_ready


def _die_with_parent() -> None:
    """In the child before exec: SIGTERM when the benchmark dies (Linux), so that a killed
    benchmark leaves no server behind."""
    import ctypes
    import signal

    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


@dataclass
class Started:
    """Server processes started so far; :meth:`close` stops them all."""

    procs: list[subprocess.Popen] = field(default_factory=list)

    def start(self, command: Callable[[int], list[str]], label: str,
              port: int = 0) -> tuple[str, Path]:
        """(URL, log) of ``command(port)`` once its /health answers (``port`` 0: a free
        one)."""
        port = port or free_port()
        log = Path(tempfile.mkstemp(suffix=".log", prefix="fp8serve-bench-")[1])
        with log.open("w") as out:
            proc = subprocess.Popen(command(port), stdout=out, stderr=subprocess.STDOUT,
                                    preexec_fn=_die_with_parent)
        self.procs.append(proc)
        url = f"http://127.0.0.1:{port}"
        print(f"started {url} ({label}; log {log})", flush=True)
        wait_ready(url, proc, 900.0, log)
        return url, log

    def close(self) -> None:
        for proc in self.procs:
            stop(proc)


def fp8serve_command(model: Path, flags: list[str]) -> Callable[[int], list[str]]:
    return lambda port: [sys.executable, "-m", "cli.main", "--log-level", "WARNING", "serve",
                         "--model", str(model), "--port", str(port), *flags]


@contextlib.contextmanager
def _fp8serve_pair(args: argparse.Namespace, first: tuple[str, list[str]],
                   second: tuple[str, list[str]]) -> Iterator[tuple[Path, list[str], str, str]]:
    """Two `fp8serve serve` processes on --model-dir (default: the demo model), each given
    max(--concurrency) sequences, --server-arg and then its own (label, flags); yields
    (model, those common flags, first URL, second URL) and stops both on exit."""
    from engine.demo_model import ensure_demo_model

    model = args.model_dir or ensure_demo_model()
    common = ["--max-num-seqs", str(max(args.concurrency)), *args.server_arg]
    started = Started()
    try:
        urls = [started.start(fp8serve_command(model, [*common, *flags]), label)[0]
                for label, flags in (first, second)]
        yield model, common, urls[0], urls[1]
    finally:
        started.close()


@contextlib.contextmanager
def spec_servers(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """(URL with speculation, URL without): two `fp8serve serve` processes on free ports,
    the same model and flags but --speculative-config; stopped on exit."""
    from engine.config import ConfigError
    from engine.spec.config import SpeculativeConfig

    try:
        spec = SpeculativeConfig.parse(args.speculative_config)
    except ConfigError as exc:
        raise BenchError(str(exc)) from exc
    if spec is None:
        raise BenchError("--speculative-config: give a config to compare with")
    with _fp8serve_pair(args, ("speculative", ["--speculative-config", spec.to_json()]),
                        ("plain", [])) as (_, _, on, off):
        yield on, off


@contextlib.contextmanager
def flag_servers(args: argparse.Namespace) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(URL of fp8serve with --server-arg, URL with --compare-server-arg added, what each
    runs): two `fp8serve serve` processes on the same model; stopped on exit."""
    extra = args.compare_server_arg
    names = (" ".join(["fp8serve", *args.server_arg]),
             " ".join(["fp8serve", *args.server_arg, *extra]))
    with _fp8serve_pair(args, (names[0], []), (names[1], extra)) as (model, common, a, b):
        yield a, b, {a: {"name": names[0], "model": str(model), "flags": common},
                     b: {"name": names[1], "model": str(model), "flags": [*common, *extra]}}


@contextlib.contextmanager
def prediction_servers(args: argparse.Namespace
                       ) -> Iterator[tuple[str, str, dict[str, Any], dict[str, dict[str, Any]]]]:
    """(URL driven with chat requests each carrying the workload's text as its
    ``prediction``, URL driven with the same chat requests without it, what each runs, the
    config fields of each): two `fp8serve serve` processes with the same flags, so the two
    sides differ only in the requests (the first over the second is what the prediction
    is worth, as with speculation on over off); stopped on exit."""
    from bench.spec.workloads import PREDICTIONS

    if args.workload not in PREDICTIONS:
        raise BenchError(f"--prediction: the workload has no text to predict; choose from "
                         f"{', '.join(PREDICTIONS)}")
    names = ("fp8serve, chat requests with a prediction", "fp8serve, chat requests")
    with _fp8serve_pair(args, (names[0], []), (names[1], [])) as (model, common, a, b):
        info = {u: {"name": n, "model": str(model), "flags": common}
                for u, n in ((a, names[0]), (b, names[1]))}
        yield a, b, info, {a: {"chat": True, "prediction": PREDICTIONS[args.workload]},
                           b: {"chat": True}}


def context_per_sequence(args: argparse.Namespace) -> int:
    """KV tokens one sequence of the workload can reach, plus a margin."""
    longest = {"multi-turn": args.system_len + args.turns * (args.input_len + args.output_len),
               "shared-prefix": args.system_len + args.input_len + args.output_len}
    return longest.get(args.workload, args.input_len + args.output_len) + 64


def baseline_gguf(args: argparse.Namespace, model: Path, demo: bool) -> Path:
    """--gguf, else the demo model's original GGUF (with the demo model), else the
    checkpoint's --gguf-type export (bench/generate/gguf_export.py, cached beside it)."""
    if args.gguf is not None:
        return Path(args.gguf)
    if demo:
        from engine.demo_model import find_gguf

        return Path(find_gguf())
    from bench.generate.gguf_export import ensure_gguf

    return ensure_gguf(model, args.gguf_type, print)


@contextlib.contextmanager
def llama_servers(args: argparse.Namespace) -> Iterator[tuple[str, str, dict[str, Any]]]:
    """(fp8serve URL, llama-server URL, what each serves): the checkpoint under fp8serve
    and its GGUF under this host's llama.cpp build, each with ``max(concurrency)``
    sequences at once and the same threads; stopped on exit."""
    from bench.llamacpp.build import ensure_native, system_info
    from bench.llamacpp.server import server_command
    from engine.demo_model import ensure_demo_model
    from engine.hardware_probe import probe_hardware

    model = args.model_dir or ensure_demo_model()
    gguf = baseline_gguf(args, model, args.model_dir is None)
    threads = args.threads or os.cpu_count() or 1
    slots = max(args.concurrency)
    build = ensure_native(probe_hardware())
    started = Started()
    try:
        mine, _ = started.start(fp8serve_command(model, [
            "--max-num-seqs", str(slots), "--threads", str(threads), *args.server_arg]),
            "fp8serve")
        theirs, _ = started.start(lambda port: server_command(
            build, gguf, port, slots, context_per_sequence(args), threads), "llama-server")
        info = {mine: {"name": "fp8serve", "model": str(model), "threads": threads},
                theirs: {"name": f"llama-server ({gguf.name})", "gguf": str(gguf),
                         "threads": threads, "llama_cpp": build.version, "built": build.how,
                         "system_info": system_info(build.lib_dir)}}
        print(f"llama-server {build.version} ({build.how}): {info[theirs]['system_info']}",
              flush=True)
        yield mine, theirs, info
    finally:
        started.close()
