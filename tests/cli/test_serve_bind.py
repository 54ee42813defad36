"""`fp8serve serve` reports an address it cannot bind (a port in use, a host not of this
machine) before it loads the model: the load of a large checkpoint took minutes first."""

from __future__ import annotations

import socket

import cli.serve
from cli.main import main


def _no_load(settings):
    raise AssertionError("the model was loaded")


def test_serve_reports_a_port_in_use_before_loading(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setattr(cli.serve, "_load_backend", _no_load)  # a load took minutes first
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        assert main(["serve", "--model", str(tmp_path), "--threads", "1", "--host",
                     "127.0.0.1", "--port", str(port)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"fp8serve: error: --host 127.0.0.1 --port {port}: cannot bind")
    assert err.count("\n") == 1


def test_serve_reports_a_host_it_cannot_resolve(monkeypatch, tmp_path, capsys) -> None:
    monkeypatch.setattr(cli.serve, "_load_backend", _no_load)
    assert main(["serve", "--model", str(tmp_path), "--threads", "1", "--host",
                 "no-such-host.invalid", "--port", "0"]) == 1
    assert capsys.readouterr().err.startswith("fp8serve: error: --host no-such-host.invalid: ")
