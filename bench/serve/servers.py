"""The servers a serving benchmark starts itself (bench/serve/cli.py): fp8serve with and
without a speculative config."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path

from bench.common.errors import BenchError


@contextlib.contextmanager
def spec_servers(args: argparse.Namespace) -> Iterator[tuple[str, str]]:
    """(URL with speculation, URL without): two `fp8serve serve` processes on free ports,
    the same model and flags but --speculative-config; stopped on exit."""
    import socket
    import subprocess
    import sys
    import tempfile

    from bench.common.server_process import stop, wait_ready
    from engine.config import ConfigError
    from engine.demo_model import ensure_demo_model
    from engine.spec.config import SpeculativeConfig

    try:
        spec = SpeculativeConfig.parse(args.speculative_config)
    except ConfigError as exc:
        raise BenchError(str(exc)) from exc
    if spec is None:
        raise BenchError("--speculative-config: give a config to compare with")
    model = args.model_dir or ensure_demo_model()
    common = ["--max-num-seqs", str(max(args.concurrency)), *args.server_arg]
    procs = []
    try:
        urls = []
        for extra in (["--speculative-config", spec.to_json()], []):
            with socket.socket() as sock:
                sock.bind(("127.0.0.1", 0))
                port = sock.getsockname()[1]
            log = Path(tempfile.mkstemp(suffix=".log", prefix="fp8serve-bench-")[1])
            cmd = [sys.executable, "-m", "cli.main", "--log-level", "WARNING", "serve",
                   "--model", str(model), "--port", str(port), *common, *extra]
            proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
            procs.append(proc)
            url = f"http://127.0.0.1:{port}"
            print(f"started {url} ({'speculative' if extra else 'plain'}; log {log})",
                  flush=True)
            wait_ready(url, proc, 900.0, log)
            urls.append(url)
        yield urls[0], urls[1]
    finally:
        for proc in procs:
            stop(proc)
