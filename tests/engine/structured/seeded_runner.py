"""A model stand-in with a real vocabulary: each logits row is a pseudo-random function of
the sequence so far (seeded by its tokens), so a row never depends on the rest of the
batch, and recompute after preemption gives the same rows. Padding columns past the
tokenizer's vocabulary get a large logit: only a mask keeps them from being chosen."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field

import torch

from engine.batch import BatchInputs, LogitsWanted

PAD_LOGIT = 9.0  # above most rows' best allowed token under a grammar, below the row max


@dataclass
class SeededRunner:
    vocab_size: int  # the tokenizer's ids
    num_padding: int = 8  # extra logit columns, as models round their vocabulary up
    num_kv_blocks: int = 256
    block_size: int = 4
    seqs: dict[int, dict[int, int]] = field(default_factory=dict)  # seq id -> pos -> id

    def row(self, seq: list[int]) -> torch.Tensor:
        g = torch.Generator().manual_seed(zlib.crc32(str(seq).encode()))
        out = torch.randn(self.vocab_size + self.num_padding, generator=g) * 4
        out[self.vocab_size:] = PAD_LOGIT
        return out

    def run(self, batch: BatchInputs) -> torch.Tensor:
        rows = []
        for c in batch.chunks:
            known = self.seqs.setdefault(c.seq_id, {})
            for i, t in enumerate(c.token_ids):
                known[c.start_pos + i] = t
            want = {LogitsWanted.NONE: [], LogitsWanted.LAST: [c.num_tokens - 1],
                    LogitsWanted.ALL: list(range(c.num_tokens))}[c.logits]
            for i in want:
                rows.append(self.row([known[p] for p in range(c.start_pos + i + 1)]))
        width = self.vocab_size + self.num_padding
        return torch.stack(rows) if rows else torch.empty(0, width)
