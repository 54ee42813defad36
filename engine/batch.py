"""The contract between the scheduler and the model runner.

Each engine step the scheduler hands the runner a :class:`BatchInputs`: one
:class:`SeqChunk` per scheduled sequence. A chunk is either a slice of a prompt (chunked
prefill) or the single newest token of a running sequence (decode). KV-cache blocks are
allocated by the scheduler (engine/kv/block_allocator.py) and only *named* here by index; the runner
owns the KV tensors.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class LogitsWanted(enum.Enum):
    NONE = "none"  # non-final prefill chunk: only fill the KV cache
    LAST = "last"  # one row: the logits after the chunk's last token
    ALL = "all"  # one row per token of the chunk (prompt logprobs / echo)


@dataclass(frozen=True, slots=True)
class SeqChunk:
    seq_id: int
    token_ids: tuple[int, ...]  # tokens to run this step, len >= 1
    start_pos: int  # position of token_ids[0] == tokens already in the KV cache
    block_table: tuple[int, ...]  # KV block ids covering [0, start_pos + len(token_ids))
    logits: LogitsWanted = LogitsWanted.LAST

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_logit_rows(self) -> int:
        if self.logits is LogitsWanted.NONE:
            return 0
        return 1 if self.logits is LogitsWanted.LAST else self.num_tokens


@dataclass(frozen=True, slots=True)
class BatchInputs:
    chunks: tuple[SeqChunk, ...]

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def num_logit_rows(self) -> int:
        return sum(c.num_logit_rows for c in self.chunks)
