"""Per-request sampling parameters (OpenAI / vLLM semantics), validated on construction.

``n`` (several completions per prompt) is handled by the caller: it submits ``n`` requests
with the same prompt, each with its own seed (``seed + i`` when a seed is given).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.structured.compiler import CompiledGrammar

MAX_LOGPROBS = 20


class SamplingParamsError(ValueError):
    """A sampling parameter is out of range; the message names the field."""


def _check(cond: bool, name: str, msg: str) -> None:
    if not cond:
        raise SamplingParamsError(f"{name}: {msg}")


def _finite(x: float) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _as_tuple(value: str | Iterable | None) -> tuple:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    return tuple(value)


@dataclass(frozen=True)
class ThinkingBudget:
    """At most ``budget`` output tokens inside reasoning sections. A section runs from
    ``start_token_id`` to ``end_token_id`` (the markers themselves are not counted, an end
    outside a section and a start inside one change nothing, as the reasoning parsers read
    them); ``starts_inside``: the prompt opened one, so the output begins inside it. Once
    the budget is spent, a section still open can only be closed: the sampler allows
    ``end_token_id`` alone (engine/sampler.py), so the next token ends the reasoning."""

    start_token_id: int
    end_token_id: int
    budget: int
    starts_inside: bool = False

    def __post_init__(self) -> None:
        for name in ("start_token_id", "end_token_id", "budget"):
            v = getattr(self, name)
            _check(isinstance(v, int) and not isinstance(v, bool) and v >= 0,
                   f"thinking.{name}", f"must be an integer >= 0, got {v!r}")
        _check(self.start_token_id != self.end_token_id, "thinking",
               f"start and end are one token ({self.start_token_id})")


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token and when to stop.

    temperature 0 means greedy (argmax). top_k -1 or 0 means off. logprobs: None for no
    logprobs, k in 0..20 for the chosen token's logprob plus k top alternatives.
    logit_bias maps token id -> additive bias in [-100, 100] (stored read-only).
    grammar: a compiled constraint (engine/structured): every sampled token must keep the
    output a valid prefix of it; not part of equality.
    thinking: a cap on the output's reasoning tokens (:class:`ThinkingBudget`); None: none.
    """

    max_tokens: int | None = 16  # None: until EOS / max_model_len
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    min_tokens: int = 0
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: Mapping[int, float] = field(default_factory=dict)
    logprobs: int | None = None
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    grammar: CompiledGrammar | None = field(default=None, compare=False)
    thinking: ThinkingBudget | None = None
    # vLLM's allowed_token_ids (None: every id) and bad_words as token sequences: a
    # sequence's last token is banned where the output ends with the rest of it
    allowed_token_ids: tuple[int, ...] | None = None
    bad_words_ids: tuple[tuple[int, ...], ...] = ()
    # the model's output limit (generation_config max_new_tokens) for a request that sent
    # none (max_tokens None): the output stops there or where the room the prompt leaves
    # ends, whichever comes first, as vLLM caps it (a max_tokens sent over the room: a 400)
    default_max_tokens: int | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "stop", _as_tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(_as_tuple(self.stop_token_ids)))
        if self.allowed_token_ids is not None:
            object.__setattr__(self, "allowed_token_ids", tuple(self.allowed_token_ids))
        object.__setattr__(self, "bad_words_ids",
                           tuple(tuple(w) for w in self.bad_words_ids))
        bias = {int(k): float(v) for k, v in dict(self.logit_bias or {}).items()}
        object.__setattr__(self, "logit_bias", MappingProxyType(bias))
        self._validate_lengths()
        self._validate_distribution()
        self._validate_penalties()
        self._validate_outputs()

    def _validate_lengths(self) -> None:
        mt = self.max_tokens
        _check(mt is None or (isinstance(mt, int) and mt >= 1), "max_tokens",
               f"must be >= 1, got {mt}")
        dm = self.default_max_tokens
        _check(dm is None or (isinstance(dm, int) and dm >= 1), "default_max_tokens",
               f"must be >= 1, got {dm}")
        _check(isinstance(self.min_tokens, int) and self.min_tokens >= 0, "min_tokens",
               f"must be >= 0, got {self.min_tokens}")
        _check(mt is None or self.min_tokens <= mt, "min_tokens",
               f"{self.min_tokens} exceeds max_tokens {mt}")
        seed_ok = isinstance(self.seed, int) and not isinstance(self.seed, bool)
        _check(self.seed is None or seed_ok, "seed", f"must be an integer, got {self.seed!r}")

    def _validate_distribution(self) -> None:
        t = self.temperature
        _check(_finite(t) and t >= 0, "temperature", f"must be a finite number >= 0, got {t}")
        _check(_finite(self.top_p) and 0 < self.top_p <= 1, "top_p",
               f"must be in (0, 1], got {self.top_p}")
        _check(isinstance(self.top_k, int) and self.top_k >= -1, "top_k",
               f"must be -1 (off), 0 (off) or >= 1, got {self.top_k}")
        _check(_finite(self.min_p) and 0 <= self.min_p <= 1, "min_p",
               f"must be in [0, 1], got {self.min_p}")

    def _validate_penalties(self) -> None:
        rp = self.repetition_penalty
        _check(_finite(rp) and rp > 0, "repetition_penalty", f"must be > 0, got {rp}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            _check(_finite(v) and -2 <= v <= 2, name, f"must be in [-2, 2], got {v}")
        for tok, b in self.logit_bias.items():
            _check(tok >= 0, "logit_bias", f"token id {tok} must be >= 0")
            _check(math.isfinite(b) and -100 <= b <= 100, "logit_bias",
                   f"bias {b} for token {tok} must be in [-100, 100]")

    def _validate_outputs(self) -> None:
        for name in ("logprobs", "prompt_logprobs"):
            v = getattr(self, name)
            _check(v is None or (isinstance(v, int) and 0 <= v <= MAX_LOGPROBS), name,
                   f"must be None or an integer in 0..{MAX_LOGPROBS}, got {v!r}")
        for s in self.stop:
            _check(isinstance(s, str) and s != "", "stop", "stop strings must be non-empty str")
        for t in self.stop_token_ids:
            _check(isinstance(t, int) and t >= 0, "stop_token_ids", f"bad token id {t!r}")
        allowed = self.allowed_token_ids
        _check(allowed is None or (len(allowed) > 0 and all(
            isinstance(t, int) and t >= 0 for t in allowed)), "allowed_token_ids",
               "must be a non-empty list of token ids >= 0")
        _check(all(len(w) > 0 and all(isinstance(t, int) and t >= 0 for t in w)
                   for w in self.bad_words_ids), "bad_words", "every word needs token ids")
        _check(self.grammar is None or hasattr(self.grammar, "new_matcher"), "grammar",
               f"must be a CompiledGrammar, got {type(self.grammar).__name__}")
        _check(self.thinking is None or isinstance(self.thinking, ThinkingBudget), "thinking",
               f"must be a ThinkingBudget, got {type(self.thinking).__name__}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def top_k_enabled(self) -> bool:
        return self.top_k >= 1

    @property
    def has_penalties(self) -> bool:
        return (self.repetition_penalty != 1.0 or self.presence_penalty != 0.0
                or self.frequency_penalty != 0.0)

    @property
    def filters_tokens(self) -> bool:
        """allowed_token_ids or bad_words mask the logits."""
        return self.allowed_token_ids is not None or bool(self.bad_words_ids)

    def validate_for_vocab(self, vocab_size: int) -> None:
        """Token ids named by the request must exist in the model's vocabulary."""
        tb = self.thinking
        marks = (tb.start_token_id, tb.end_token_id) if tb is not None else ()
        for name, ids in (("logit_bias", self.logit_bias.keys()),
                          ("stop_token_ids", self.stop_token_ids), ("thinking", marks),
                          ("allowed_token_ids", self.allowed_token_ids or ())):
            bad = [t for t in ids if t >= vocab_size]
            _check(not bad, name, f"token ids {bad[:5]} out of range for vocab {vocab_size}")
        g = self.grammar
        _check(g is None or g.vocab_size <= vocab_size, "grammar",
               f"compiled for {getattr(g, 'vocab_size', 0)} ids, the model has {vocab_size}")
