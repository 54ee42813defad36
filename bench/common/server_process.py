"""An `fp8serve serve` subprocess that a benchmark starts: a free port for it, waiting for
its /health, stopping it (bench/rss/run.py, bench/serve/cli.py)."""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_ready(url: str, proc: subprocess.Popen, timeout_s: float, log_path: Path) -> float:
    """Seconds until GET /health answered 200; raises if the server exits or times out."""
    import httpx

    t0 = time.monotonic()
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited ({proc.returncode}): "
                               f"{log_path.read_text()[-2000:]}")
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"server not ready after {timeout_s:.0f} s")
        try:
            if httpx.get(url + "/health", timeout=2).status_code == 200:
                return time.monotonic() - t0
        except httpx.HTTPError:
            pass
        time.sleep(0.5)


def stop(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM (the server drains), then SIGKILL after ``grace_s``."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
