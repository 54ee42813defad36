"""One generation request as the engine tracks it: tokens, KV bookkeeping, status, timing.

Token accounting is uniform for prefill, decode and recompute after preemption: the
sequence is ``all_ids = prompt_ids + output_ids`` and ``num_computed`` of those tokens have
their K/V in the cache. Each step the scheduler runs (a prefix of) ``all_ids[num_computed:]``;
a decode is simply the case where exactly one token is uncomputed.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any


class RequestStatus(enum.Enum):
    WAITING = "waiting"  # queued, or preempted and waiting to be recomputed
    RUNNING = "running"  # admitted: holds KV blocks, scheduled every step
    FINISHED = "finished"


class FinishReason(str, enum.Enum):
    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens or max_model_len reached
    ABORT = "abort"  # client went away or asked to cancel
    TIMEOUT = "timeout"  # per-request deadline passed
    ERROR = "error"  # this request failed inside the engine (others keep running)


@dataclass(eq=False)
class Request:
    """Mutable per-request state, owned by the engine thread once added.

    ``params`` is an ``engine.sampling_params.SamplingParams``; the engine reads
    max_tokens, min_tokens, ignore_eos, stop_token_ids, seed, logprobs, stop,
    skip_special_tokens and include_stop_str_in_output from it.
    """

    request_id: str
    prompt_ids: tuple[int, ...]
    params: Any
    arrival_time: float
    deadline: float | None = None  # engine clock; None = no timeout
    tag: str = ""  # a label for its metrics: the API it came through (service/metrics.py)
    # priority scheduling (engine/scheduler.py): lower runs first; 0 under FCFS
    priority: int = 0
    seq_id: int = -1
    status: RequestStatus = RequestStatus.WAITING
    output_ids: list[int] = field(default_factory=list)
    num_computed: int = 0  # tokens of all_ids whose K/V is in the cache
    block_table: list[int] = field(default_factory=list)
    finish_reason: FinishReason | None = None
    error: str | None = None
    first_scheduled_time: float | None = None
    first_token_time: float | None = None
    last_token_time: float | None = None
    num_preemptions: int = 0
    # params.prompt_logprobs set: entry p scores prompt_ids[p] given prompt_ids[:p]
    # (engine.stream.TokenLogprob; entry 0 is None), filled as prefill chunks run and kept
    # across preemption (a recomputed chunk scores only positions not yet scored)
    prompt_logprobs: list[Any] = field(default_factory=list)
    # prefix caching (engine/kv/prefix_cache.py): requests with different salts never
    # share blocks; block_hashes[i] names the content of all_ids' full block i;
    # block_table[:num_committed_blocks] are registered in the cache
    cache_salt: str | None = None
    block_hashes: list[bytes] = field(default_factory=list)
    num_committed_blocks: int = 0
    num_cached_tokens: int = 0  # prompt tokens found in the cache when first admitted
    # encoded images in the prompt (engine.vision.prompt_image.PromptImage, prompt order):
    # their features replace the [IMG] embeddings; their content hashes key the KV blocks
    # that hold their positions
    images: tuple[Any, ...] = ()
    # speculative decoding (engine/spec/): the draft tokens the scheduler put after the
    # newest token in this step's chunk; () when the request does not draft this step
    spec_ids: tuple[int, ...] = ()
    # predicted outputs (engine/spec/prediction.py): the prediction's token ids, and of the
    # draft tokens taken from it so far, those verification accepted and rejected
    prediction_ids: tuple[int, ...] = ()
    num_accepted_prediction_tokens: int = 0
    num_rejected_prediction_tokens: int = 0

    def __post_init__(self) -> None:
        if not self.prompt_ids:
            raise ValueError(f"request {self.request_id}: empty prompt")

    @property
    def all_ids(self) -> list[int]:
        return [*self.prompt_ids, *self.output_ids]

    def token_slice(self, start: int, end: int) -> tuple[int, ...]:
        """``tuple(all_ids[start:end])`` without building all_ids (a decode reads only the
        newest output token)."""
        np_ = len(self.prompt_ids)
        if start >= np_:
            return tuple(self.output_ids[start - np_:end - np_])
        if end <= np_:
            return tuple(self.prompt_ids[start:end])
        return tuple(self.prompt_ids[start:]) + tuple(self.output_ids[:end - np_])

    @property
    def num_tokens(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_uncomputed(self) -> int:
        return self.num_tokens - self.num_computed

    @property
    def is_decoding(self) -> bool:
        """Exactly one token (the newest sample) waits to be run."""
        return self.num_uncomputed == 1 and bool(self.output_ids)

    @property
    def wants_prompt_logprobs(self) -> bool:
        """Prompt logprobs were asked for and some prompt position is not scored yet."""
        return (getattr(self.params, "prompt_logprobs", None) is not None
                and len(self.prompt_logprobs) < len(self.prompt_ids))

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED


class EngineError(Exception):
    """Base of the errors :meth:`engine.engine.Engine.add_request` raises."""


class InvalidRequestError(EngineError):
    """The request cannot be served as asked; ``param`` names the offending field."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class QueueFullError(EngineError):
    """More than max_queue requests are already waiting."""


class EngineUnavailableError(EngineError):
    """The engine is draining (shutting down) or dead; ``state`` says which."""

    def __init__(self, message: str, state: str) -> None:
        super().__init__(message)
        self.state = state
