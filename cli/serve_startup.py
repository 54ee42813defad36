"""`fp8serve serve` before uvicorn starts: the checks that fail fast (the address binds,
the checkpoint and tokenizer load, each error one line naming its cause), the default
--max-model-len fitted to the checkpoint, and SIGTERM ending the process while the model
loads."""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from cli.main import CliError

log = logging.getLogger(__name__)


def check_bind(host: str, port: int) -> None:
    """Fail before the model loads (minutes for a large checkpoint) when the address
    cannot be bound: a port in use, a host that is not this machine's. The socket is
    closed at once; uvicorn binds again once the model is ready."""
    import socket

    try:
        family, kind, proto, _, addr = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as exc:
        raise CliError(f"--host {host}: {getattr(exc, 'strerror', None) or exc}") from None
    with socket.socket(family, kind, proto) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        try:
            sock.bind(addr)
        except OSError as exc:
            raise CliError(f"--host {host} --port {port}: cannot bind: "
                           f"{exc.strerror or exc}") from None


@contextmanager
def exit_on_sigterm() -> Iterator[None]:
    """While the model loads (minutes for a large checkpoint), SIGTERM ends the process.
    A container's PID 1 never receives a signal it has no handler for (the kernel drops
    it): a pod stopped while loading started serving anyway and waited for SIGKILL at the
    end of its grace period. Once uvicorn runs, SIGTERM drains (DrainingServer)."""
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers can only be set from the main thread
        return

    def stop(sig: int, frame: Any) -> None:
        log.info("signal %d while loading the model: exiting", sig)
        raise SystemExit(128 + sig)

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _fit_max_model_len(settings: Any) -> Any:
    """``settings`` with max_model_len lowered to the checkpoint's max_position_embeddings
    when neither --max-model-len nor FP8SERVE_MAX_MODEL_LEN gave it and the default (4096)
    is above that (vLLM's default is the model's own limit); else as they are."""
    from engine.checkpoint.errors import CheckpointError
    from engine.config import ConfigError
    from service.backend import default_max_model_len

    try:
        fitted = default_max_model_len(settings)
    except (CheckpointError, ConfigError, OSError, ValueError) as exc:  # as _load_backend
        raise CliError(str(exc) or type(exc).__name__) from None
    if fitted == settings.max_model_len:
        return settings
    log.info("max_model_len %d: the checkpoint's max_position_embeddings, below the default "
             "%d (--max-model-len sets it)", fitted, settings.max_model_len)
    return settings.model_copy(update={"max_model_len": fitted})


def _load_backend(settings: Any) -> Any:
    """Load the model before uvicorn starts, so a bad checkpoint or tokenizer ends the
    process with one line naming the file and tensor (not a lifespan traceback), and the
    port only opens once the model is ready."""
    from engine.checkpoint.errors import CheckpointError
    from engine.config import ConfigError
    from engine.demo_model import DemoModelError
    from engine.kernels.registry import NoKernelError
    from engine.text.tokenizer import TokenizerLoadError
    from service.backend import load_backend
    from service.tool_calls.select import choose_parsers

    try:
        backend = load_backend(settings)
        choose_parsers(backend.tokenizer, settings.tool_call_parser, settings.reasoning_parser)
        return backend
    except (CheckpointError, ConfigError, DemoModelError, NoKernelError, TokenizerLoadError,
            OSError, ValueError) as exc:
        raise CliError(str(exc) or type(exc).__name__) from None
