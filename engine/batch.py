"""The contract between the scheduler and the model runner.

Each engine step the scheduler hands the runner a :class:`BatchInputs`: one
:class:`SeqChunk` per scheduled sequence. A chunk is either a slice of a prompt (chunked
prefill) or the single newest token of a running sequence (decode). KV-cache blocks are
allocated by the scheduler (engine/kv/block_allocator.py) and only *named* here by index; the runner
owns the KV tensors.

A prompt chunk may carry :class:`ChunkEmbeds`: precomputed input embeddings (image
features, engine/vision) that replace the token embeddings of some of its tokens. The
tokens there are still real ids (``[IMG]``), so prefix-cache keys and logits stay
defined; only the input row of the model changes.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class LogitsWanted(enum.Enum):
    NONE = "none"  # non-final prefill chunk: only fill the KV cache
    LAST = "last"  # one row: the logits after the chunk's last token
    ALL = "all"  # one row per token of the chunk (prompt logprobs / echo)


@dataclass(frozen=True, slots=True, eq=False)
class ChunkEmbeds:
    """Input embeddings for some tokens of one chunk: row i of ``values`` replaces the
    embedding of ``token_ids[offsets[i]]``."""

    offsets: tuple[int, ...]  # strictly increasing offsets into the chunk's token_ids
    values: torch.Tensor  # [len(offsets), H] bf16, contiguous

    def __post_init__(self) -> None:
        v = self.values
        if v.dim() != 2 or v.dtype != torch.bfloat16 or v.shape[0] != len(self.offsets):
            raise ValueError(f"ChunkEmbeds.values must be bf16 [{len(self.offsets)}, H], got "
                             f"{v.dtype} {list(v.shape)}")
        if any(b <= a for a, b in zip(self.offsets, self.offsets[1:], strict=False)) or (
                self.offsets and self.offsets[0] < 0):
            raise ValueError("ChunkEmbeds.offsets must be non-negative and increasing")


@dataclass(frozen=True, slots=True)
class SeqChunk:
    seq_id: int
    token_ids: tuple[int, ...]  # tokens to run this step, len >= 1
    start_pos: int  # position of token_ids[0] == tokens already in the KV cache
    block_table: tuple[int, ...]  # KV block ids covering [0, start_pos + len(token_ids))
    logits: LogitsWanted = LogitsWanted.LAST
    embeds: ChunkEmbeds | None = None  # image features for some of token_ids
    # speculative decoding: the last num_draft token_ids are draft tokens after the
    # sequence's newest token (token_ids[0]); such a chunk wants logits ALL, row j scoring
    # the token after token_ids[j]. The runner treats it as any other chunk.
    num_draft: int = 0
    # the sequence's prompt length: positions at or past it are generated rows (decode,
    # drafts, output recomputed after a preemption), which run on the generated-rows kernel
    # where a layer has one (engine/kernels/amx.py); None: every row is a prompt row
    prompt_len: int | None = None

    def __post_init__(self) -> None:
        if self.num_draft and (self.num_draft >= len(self.token_ids)
                               or self.logits is not LogitsWanted.ALL):
            raise ValueError(f"a chunk with {self.num_draft} draft tokens needs at least one "
                             f"token before them and logits ALL")
        if self.embeds is not None and self.embeds.offsets and (
                self.embeds.offsets[-1] >= len(self.token_ids)):
            raise ValueError(f"ChunkEmbeds offset {self.embeds.offsets[-1]} outside a chunk "
                             f"of {len(self.token_ids)} tokens")

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_logit_rows(self) -> int:
        if self.logits is LogitsWanted.NONE:
            return 0
        return 1 if self.logits is LogitsWanted.LAST else self.num_tokens

    @property
    def num_prompt_rows(self) -> int:
        """Leading token_ids at positions before prompt_len (the rest are generated)."""
        if self.prompt_len is None:
            return self.num_tokens
        return min(self.num_tokens, max(0, self.prompt_len - self.start_pos))


@dataclass(frozen=True, slots=True)
class BatchInputs:
    chunks: tuple[SeqChunk, ...]

    @property
    def num_tokens(self) -> int:
        return sum(c.num_tokens for c in self.chunks)

    @property
    def num_logit_rows(self) -> int:
        return sum(c.num_logit_rows for c in self.chunks)

    def generated_rows(self) -> torch.Tensor | None:
        """uint8 [T] over the flattened step tokens, 1 for a generated row (SeqChunk
        prompt_len), 0 for a prompt row; None when every row is a prompt row."""
        flags: list[int] = []
        for c in self.chunks:
            p = c.num_prompt_rows
            flags += [0] * p + [1] * (c.num_tokens - p)
        if not any(flags):
            return None
        return torch.tensor(flags, dtype=torch.uint8)

    def embed_rows(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(rows [N] int64 of the flattened step tokens, values [N, H] bf16) over every
        chunk's embeds, in chunk order; None when no chunk carries any."""
        rows: list[int] = []
        values: list[torch.Tensor] = []
        offset = 0
        for c in self.chunks:
            if c.embeds is not None and c.embeds.offsets:
                rows.extend(offset + o for o in c.embeds.offsets)
                values.append(c.embeds.values)
            offset += c.num_tokens
        if not rows:
            return None
        return torch.tensor(rows, dtype=torch.int64), torch.cat(values)
