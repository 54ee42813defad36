"""How long a SIGTERM'd `fp8serve serve` may take to exit, from the server's own numbers,
for the tests that check the grace periods of deploy/ (compose stop_grace_period, the
pods' terminationGracePeriodSeconds) against it."""

from __future__ import annotations

import inspect

from cli.serve_server import END_GRACE_S
from engine.engine import Engine
from service.settings import Settings

DEFAULT_DRAIN_S = Settings.model_fields["drain_timeout"].default
ENGINE_JOIN_S = inspect.signature(Engine.shutdown).parameters["timeout"].default


def stop_seconds(drain_s: float) -> float:
    """The worst case (cli/serve_server.py, DrainingServer): the drain, then END_GRACE_S for the
    error answers of the requests it ended, uvicorn's graceful shutdown
    (timeout_graceful_shutdown=END_GRACE_S) and the engine thread's join (state.close)."""
    return drain_s + END_GRACE_S + END_GRACE_S + ENGINE_JOIN_S
