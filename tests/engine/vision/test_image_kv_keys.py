"""Image content hashes in the prefix-cache block keys: the same image reuses its KV
blocks (a multi-turn chat), a different image with the same [IMG] layout never does,
and blocks before the first image stay shared. Scheduler-level, with the fake runner of
tests/engine/kv/test_prefix_cache.py."""

from __future__ import annotations

import torch

from engine.vision.layout import ImageTokenIds, image_tokens
from engine.vision.preprocess import ImageGrid
from engine.vision.prompt_image import PromptImage
from tests.engine.kv.test_prefix_cache import BS, first_chunk, make, req, run

IDS = ImageTokenIds(10, 12, 13)
GRID = ImageGrid(rows=2, cols=3)  # 8 prompt tokens, 6 features


def _image_req(name: str, key: bytes, tail: list[int]):  # type: ignore[no-untyped-def]
    head = list(range(20, 29))  # 9 text tokens: blocks 0-1 are text only
    prompt = head + image_tokens(GRID, IDS) + tail
    r = req(name, prompt)
    feats = torch.zeros(GRID.num_image_tokens, 8, dtype=torch.bfloat16)
    r.images = (PromptImage(len(head), GRID, key, feats),)
    return r


def test_same_image_shares_blocks_other_image_does_not() -> None:
    sched, runner = make()
    tail = list(range(40, 52))
    run(sched, runner, _image_req("a", b"A" * 32, tail))
    same = _image_req("same", b"A" * 32, tail)
    run(sched, runner, same)
    other = _image_req("other", b"B" * 32, tail)
    run(sched, runner, other)
    total = len(same.prompt_ids)  # 29 tokens
    assert same.num_cached_tokens == (total - 1) // BS * BS == 28
    assert other.num_cached_tokens == 8  # the two text-only blocks; block 2 holds [IMG]


def test_chunks_carry_the_features_of_their_positions() -> None:
    sched, runner = make(budget=5)
    r = _image_req("a", b"A" * 32, [40, 41])
    outs = run(sched, runner, r)
    rows = [len(c.embeds.offsets) for o in outs for q, c in zip(o.requests, o.batch.chunks,
                                                                  strict=True)
            if q is r and c.embeds is not None]
    assert sum(rows) == GRID.num_image_tokens and len(rows) >= 2  # split across chunks
    assert first_chunk(outs, r).embeds is None  # positions 0-4: text
