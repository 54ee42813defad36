"""Typed reads of config.json / params.json values: a value of the wrong type is a
CheckpointError naming the file and the key (``config.json: rope_theta must be a number,
got 'big'``), never Python's own message about some conversion."""

from __future__ import annotations

import math
from typing import Any

from engine.checkpoint.errors import CheckpointError


class Fields:
    """The values of one JSON object of the file ``file`` (``prefix``: its place, e.g.
    ``rope_parameters.``)."""

    def __init__(self, data: Any, file: str, prefix: str = "") -> None:
        if not isinstance(data, dict):
            raise CheckpointError(f"{file}: {prefix.rstrip('.') or 'the file'} must be an "
                                  f"object, got {data!r}")
        self.data, self.file, self.prefix = data, file, prefix

    def _bad(self, key: str, want: str, value: Any) -> CheckpointError:
        return CheckpointError(f"{self.file}: {self.prefix}{key} must be {want}, got {value!r}")

    def get(self, key: str, default: Any = None) -> Any:
        return self.data.get(key, default)

    def has(self, key: str) -> bool:
        return self.data.get(key) is not None

    def integer(self, key: str, default: int | None = None) -> int:
        """A whole number (5.0 is 5; 5.5, "5", true are errors); ``default`` when absent
        or null, a missing-field error when there is none."""
        value = self.data.get(key)
        if value is None:
            if default is None:
                raise CheckpointError(f"{self.file}: missing field {self.prefix + key!r}")
            return default
        if (isinstance(value, bool) or not isinstance(value, int | float)
                or not math.isfinite(value) or value != int(value)):
            raise self._bad(key, "an integer", value)
        return int(value)

    def number(self, key: str, default: float | None = None) -> float:
        """A finite number (true and "1.0" are errors)."""
        value = self.data.get(key)
        if value is None:
            if default is None:
                raise CheckpointError(f"{self.file}: missing field {self.prefix + key!r}")
            return default
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
                value):
            raise self._bad(key, "a finite number", value)
        return float(value)

    def flag(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise self._bad(key, "true or false", value)
        return value

    def section(self, key: str) -> Fields | None:
        """The object at ``key`` (None when absent, null or empty)."""
        value = self.data.get(key)
        if value is None or value == {}:
            return None
        return Fields(value, self.file, f"{self.prefix}{key}.")
