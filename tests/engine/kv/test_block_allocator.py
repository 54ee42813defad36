import pytest

from engine.kv.block_allocator import BlockAllocator


def test_grow_allocates_only_missing_blocks_and_tracks_usage():
    a = BlockAllocator(num_blocks=4, block_size=4)
    t: list[int] = []
    assert a.grow(t, 5) and len(t) == 2
    assert a.grow(t, 8) and len(t) == 2  # still fits in 2 blocks
    assert a.grow(t, 9) and len(t) == 3
    assert a.usage == 0.75 and a.num_free == 1
    assert len(set(t)) == 3 and all(0 <= b < 4 for b in t)


def test_grow_fails_without_side_effects_when_full():
    a = BlockAllocator(num_blocks=2, block_size=4)
    t: list[int] = []
    assert not a.grow(t, 9)
    assert t == [] and a.num_free == 2


def test_free_returns_blocks_and_rejects_double_free():
    a = BlockAllocator(num_blocks=3, block_size=2)
    t1, t2 = [], []
    a.grow(t1, 4)
    a.grow(t2, 2)
    assert not set(t1) & set(t2)
    saved = list(t1)
    a.free(t1)
    assert t1 == [] and a.num_free == 2 and a.usage == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        a.free(saved)


def test_blocks_for_rounds_up():
    a = BlockAllocator(num_blocks=1, block_size=16)
    assert [a.blocks_for(n) for n in (0, 1, 16, 17)] == [0, 1, 1, 2]
