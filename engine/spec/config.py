"""``--speculative-config``: vLLM's JSON object and keys, checked on construction.

    {"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": N,
     "prompt_lookup_min": M, "disable_by_batch_size": B}

``prompt_lookup_min`` / ``prompt_lookup_max`` default to each other, and both to 5, as in
vLLM. ``disable_by_batch_size``: no drafts in a step with more than B running sequences
(vLLM's key; unset = always draft). Any other key is refused by name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from engine.config import ConfigError

METHODS = ("ngram",)
DEFAULT_LOOKUP = 5  # vLLM's, when neither prompt_lookup bound is given
_KEYS = ("method", "num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min",
         "disable_by_batch_size")


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int  # K: drafted tokens per step and sequence
    prompt_lookup_max: int = DEFAULT_LOOKUP  # N: the longest suffix n-gram looked up
    prompt_lookup_min: int = DEFAULT_LOOKUP  # M: the shortest
    disable_by_batch_size: int | None = None

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ConfigError(f"speculative_config.method {self.method!r} is not one of "
                              f"{', '.join(METHODS)}")
        for key in ("num_speculative_tokens", "prompt_lookup_max", "prompt_lookup_min"):
            v = getattr(self, key)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ConfigError(f"speculative_config.{key} must be an integer >= 1, "
                                  f"got {v!r}")
        if self.prompt_lookup_min > self.prompt_lookup_max:
            raise ConfigError(f"speculative_config.prompt_lookup_min "
                              f"({self.prompt_lookup_min}) exceeds prompt_lookup_max "
                              f"({self.prompt_lookup_max})")
        b = self.disable_by_batch_size
        if b is not None and (not isinstance(b, int) or isinstance(b, bool) or b < 1):
            raise ConfigError(f"speculative_config.disable_by_batch_size must be an "
                              f"integer >= 1, got {b!r}")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> SpeculativeConfig:
        unknown = sorted(set(d) - set(_KEYS))
        if unknown:
            raise ConfigError(f"speculative_config: unknown key {unknown[0]!r} (known: "
                              f"{', '.join(_KEYS)})")
        if "method" not in d or "num_speculative_tokens" not in d:
            missing = "method" if "method" not in d else "num_speculative_tokens"
            raise ConfigError(f"speculative_config.{missing} is required")
        lo, hi = d.get("prompt_lookup_min"), d.get("prompt_lookup_max")
        lo, hi = (lo if lo is not None else hi if hi is not None else DEFAULT_LOOKUP,
                  hi if hi is not None else lo if lo is not None else DEFAULT_LOOKUP)
        return cls(d["method"], d["num_speculative_tokens"], hi, lo,
                   d.get("disable_by_batch_size"))

    @classmethod
    def parse(cls, text: str | None) -> SpeculativeConfig | None:
        """The flag's JSON text; None or empty (or ``null``) = no speculation."""
        if text is None or not text.strip():
            return None
        try:
            d = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"speculative_config is not valid JSON: {exc}") from exc
        if d is None:
            return None
        if not isinstance(d, dict):
            raise ConfigError("speculative_config must be a JSON object")
        return cls.from_dict(d)

    def to_json(self) -> str:
        d = {k: getattr(self, k) for k in _KEYS}
        return json.dumps({k: v for k, v in d.items() if v is not None})
