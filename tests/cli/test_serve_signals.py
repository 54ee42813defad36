"""`fp8serve serve` ends on SIGTERM while the model loads. In a container it is PID 1,
and the kernel delivers no signal to a namespace's init that has no handler for it: a
SIGTERM during a load of minutes was dropped, the server started anyway, and the pod or
container was only stopped by SIGKILL at the end of its grace period."""

from __future__ import annotations

import signal

import pytest

import cli.serve
from cli.main import CliError, main


def test_sigterm_during_the_load_exits(monkeypatch, tmp_path) -> None:
    seen = {}

    def load(settings):
        seen["handler"] = signal.getsignal(signal.SIGTERM)
        raise CliError("stop here")

    monkeypatch.setattr(cli.serve, "_load_backend", load)
    monkeypatch.setattr(cli.serve, "_fit_max_model_len", lambda settings: settings)
    before = signal.getsignal(signal.SIGTERM)
    assert main(["serve", "--model", str(tmp_path), "--threads", "1", "--host",
                 "127.0.0.1", "--port", "0"]) == 1
    handler = seen["handler"]
    assert callable(handler) and handler not in (signal.SIG_DFL, signal.SIG_IGN)
    with pytest.raises(SystemExit) as exc:
        handler(signal.SIGTERM, None)
    assert exc.value.code == 128 + signal.SIGTERM  # as a process the signal ended
    # once loaded (or failed), the handler is the one before: uvicorn's drain takes over
    assert signal.getsignal(signal.SIGTERM) is before
