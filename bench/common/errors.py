"""The one error a benchmark command raises for its user: bad flags, a missing file, a
server that cannot be reached. `fp8serve bench` (cli/bench.py) prints it as one line and
exits with ``exit_code``; everything else is a bug and keeps its traceback."""

from __future__ import annotations


class BenchError(Exception):
    """A user-facing failure of a benchmark command (exit status ``exit_code``)."""

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code
