"""A real `fp8serve serve` subprocess on a free loopback port, for end-to-end tests."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

STARTUP_S = 600
ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(model: Path, *args: str, env: dict[str, str] | None = None) -> dict:
    """Start the server on ``model`` with extra CLI ``args`` (and ``env`` added to this
    process's environment); returns {url, proc, log} once /health answers 200 (fails with
    the log's tail if the process exits)."""
    port = free_port()
    log = tempfile.NamedTemporaryFile("w+", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "cli.serve", "--model", str(model), "--port", str(port),
           *args]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                            env=None if env is None else {**os.environ, **env})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + STARTUP_S
    while True:
        assert proc.poll() is None, f"server exited: {Path(log.name).read_text()[-3000:]}"
        assert time.monotonic() < deadline, "server did not become ready"
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    return {"url": url, "proc": proc, "log": log.name}


def stop_server(server: dict) -> None:
    proc = server["proc"]
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@contextmanager
def server_pair(model: Path, on_args: tuple[str, ...], off_args: tuple[str, ...],
                env: dict[str, str] | None = None) -> Iterator[tuple[dict, dict]]:
    """Two servers on ``model`` (``env`` added to both's environment), the path under test
    (``on_args``) and the plain one (``off_args``), started in turn; both are stopped on
    exit, and ``on`` also when the second fails to start."""
    on = start_server(model, *on_args, env=env)
    try:
        off = start_server(model, *off_args, env=env)
    except BaseException:
        stop_server(on)
        raise
    try:
        yield on, off
    finally:
        stop_server(on)
        stop_server(off)
