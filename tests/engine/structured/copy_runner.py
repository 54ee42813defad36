"""A model stand-in that copies: tests/engine/structured/seeded_runner.py's seeded rows,
plus a large logit on the token that followed the latest earlier occurrence of the
longest suffix of the sequence (up to COPY_N tokens) that occurred before (as a model
quoting its prompt would), so n-gram drafts are often right and a grammar decides where the
copy must stop."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tests.engine.structured.seeded_runner import SeededRunner

COPY_LOGIT = 30.0  # above the seeded rows (randn * 4) and the padding columns
COPY_N = 4


@dataclass
class CopyRunner(SeededRunner):
    def row(self, seq: list[int]) -> torch.Tensor:
        out = super().row(seq)
        for n in range(min(COPY_N, len(seq) - 1), 0, -1):
            tail = seq[-n:]
            e = next((e for e in range(len(seq) - 1, n - 1, -1) if seq[e - n:e] == tail),
                     None)
            if e is not None:
                out[seq[e]] += COPY_LOGIT
                break
        return out
