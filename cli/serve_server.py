"""`fp8serve serve`'s uvicorn server: its config (log levels, access log, the grace period
for the last answers) and :class:`DrainingServer`, whose first SIGTERM / Ctrl-C drains
in-flight requests for up to --drain-timeout seconds before it shuts down."""

from __future__ import annotations

import logging
import threading
from typing import Any

log = logging.getLogger(__name__)


# After the drain: the seconds the last answers (error events of requests the drain
# timeout ended included) have to reach their clients before connections are closed
END_GRACE_S = 3


def uvicorn_config(app: Any, settings: Any) -> Any:
    """The server's uvicorn.Config. Event loop and HTTP parser stay "auto": uvloop and
    httptools (dependencies) where installed, else asyncio and h11. They take about a fifth
    less CPU per streamed token, CPU that the model's threads would otherwise lose."""
    import uvicorn

    level = (settings.uvicorn_log_level
             or logging.getLevelName(logging.getLogger().level).lower())
    return uvicorn.Config(app, host=settings.host, port=settings.port, log_level=level,
                          timeout_graceful_shutdown=END_GRACE_S,
                          access_log=not settings.disable_uvicorn_access_log)


class DrainingServer:
    """uvicorn.Server whose first SIGTERM/SIGINT drains before shutting down."""

    def __new__(cls, config: Any, state: Any, drain_timeout: float) -> Any:
        import uvicorn

        class _Server(uvicorn.Server):
            draining = False

            def handle_exit(self, sig: int, frame: Any) -> None:
                if self.draining or state.engine is None:
                    return super().handle_exit(sig, frame)
                self.draining = True
                log.info("signal %d: draining (up to %.0f s for in-flight requests)",
                         sig, drain_timeout)
                state.begin_drain()
                threading.Thread(target=self._drain, daemon=True).start()

            def _drain(self) -> None:
                if not state.wait_drained(drain_timeout):
                    log.warning("drain timeout: %d requests still in flight end with an "
                                "error", state.engine.num_unfinished)
                    # each ends as an error of its own (a stream's error event and
                    # [DONE], a whole answer's JSON), not a connection cut mid-chunk
                    state.engine.end_all("the server shut down before this request "
                                         f"finished (--drain-timeout {drain_timeout:g} s)")
                    state.wait_drained(END_GRACE_S)
                self.should_exit = True

        return _Server(config)
