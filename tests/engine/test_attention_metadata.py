"""build_metadata against a direct per-token construction, on random mixed batches."""

import random

import pytest
import torch

from engine.batch import BatchInputs, LogitsWanted, SeqChunk
from engine.model.attention import build_metadata

BS = 4


def _random_batch(rng: random.Random) -> BatchInputs:
    chunks = []
    for i in range(rng.randint(1, 6)):
        start, n = rng.randint(0, 40), rng.choice([1, 1, rng.randint(1, 20)])
        blocks = -(-(start + n) // BS) + rng.randint(0, 2)
        chunks.append(SeqChunk(i, tuple(range(n)), start, tuple(rng.sample(range(200), blocks))))
    return BatchInputs(tuple(chunks))


@pytest.mark.parametrize("spans", [False, True])
def test_indices_match_per_token_definition(spans):
    rng = random.Random(0)
    for _ in range(50):
        batch = _random_batch(rng)
        meta = build_metadata(batch, BS, 200 * BS, spans=spans)
        pos, slots, seq = [], [], []
        for i, c in enumerate(batch.chunks):
            for p in range(c.start_pos, c.start_pos + c.num_tokens):
                pos.append(p)
                slots.append(c.block_table[p // BS] * BS + p % BS)
                seq.append(i)
        width = max(len(c.block_table) for c in batch.chunks)
        tables = [list(c.block_table) + [0] * (width - len(c.block_table)) for c in batch.chunks]
        assert meta.positions.dtype == torch.int64 and meta.positions.tolist() == pos
        assert meta.slot_mapping.dtype == torch.int64 and meta.slot_mapping.tolist() == slots
        p = meta.paged
        assert p.block_tables.dtype == p.token_seq.dtype == p.ctx_lens.dtype == torch.int32
        assert p.block_tables.tolist() == tables and p.token_seq.tolist() == seq
        assert p.ctx_lens.tolist() == [x + 1 for x in pos] and p.block_size == BS
        n_prefill = sum(c.num_tokens > 1 for c in batch.chunks)
        assert len(meta.prefills) == (n_prefill if spans else 0)
        if spans and n_prefill < len(batch.chunks):
            assert meta.decode is not None


def test_rejects_short_tables_foreign_blocks_and_empty_batches():
    short = BatchInputs((SeqChunk(0, (1, 2, 3), 3, (0,)),))
    with pytest.raises(ValueError, match="block_table has 1 blocks, 2 needed"):
        build_metadata(short, BS, 100)
    foreign = BatchInputs((SeqChunk(0, (1,), 0, (25,)),))
    with pytest.raises(ValueError, match="outside the KV store"):
        build_metadata(foreign, BS, 100)
    with pytest.raises(ValueError, match="empty batch"):
        build_metadata(BatchInputs(()), BS, 100)


def test_generated_rows_mark_positions_at_or_past_each_prompt() -> None:
    """SeqChunk.prompt_len splits a chunk's rows by role (engine/kernels/amx.py): a prompt
    chunk, a decode row, a chunk spanning the prompt's end (recompute after a preemption)
    and a verification chunk of drafts; no prompt_len means every row is a prompt row."""
    chunks = (SeqChunk(0, (1, 2, 3), 0, (0,), prompt_len=5),
              SeqChunk(1, (4,), 7, (1, 2), prompt_len=7),
              SeqChunk(2, (5, 6, 7, 8), 2, (3, 4), prompt_len=4),
              SeqChunk(3, (9, 10, 11), 6, (5, 6, 7), LogitsWanted.ALL, num_draft=2,
                       prompt_len=3))
    batch = BatchInputs(chunks)
    assert [c.num_prompt_rows for c in chunks] == [3, 0, 2, 0]
    rows = batch.generated_rows()
    assert rows is not None and rows.dtype == torch.uint8
    assert rows.tolist() == [0, 0, 0, 1, 0, 0, 1, 1, 1, 1, 1]
    meta = build_metadata(batch, 4, 64, spans=False)
    assert torch.equal(meta.generated_rows, rows)
    prompts = BatchInputs((SeqChunk(0, (1, 2), 0, (0,)), SeqChunk(1, (3,), 0, (1,), prompt_len=4)))
    assert prompts.generated_rows() is None
    assert build_metadata(prompts, 4, 64).generated_rows is None
