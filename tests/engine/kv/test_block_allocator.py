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


# ---- reference counts and the cached-block LRU ------------------------------------------

def _cached_table(a: BlockAllocator, tokens: int, tag: bytes) -> list[int]:
    """A table of fresh blocks, each cached under tag + its index."""
    t: list[int] = []
    assert a.grow(t, tokens)
    for i, b in enumerate(t):
        assert a.cache(b, tag + bytes([i]) * 31)
    return t


def check_invariants(a: BlockAllocator) -> None:
    free = set(a._free)
    for b in range(a.num_blocks):
        assert (b in free) == (a.ref_count(b) == 0), f"block {b} free and in use"
    assert a.usage == sum(a.ref_count(b) > 0 for b in range(a.num_blocks)) / a.num_blocks
    assert len(a._by_hash) == len(a._hash_of) == a.num_cached
    assert all(a._hash_of[b] == h for h, b in a._by_hash.items())


def test_shared_block_stays_in_use_until_its_last_holder_frees_it():
    a = BlockAllocator(num_blocks=4, block_size=2)
    t1 = _cached_table(a, 4, b"a")
    t2: list[int] = []
    a.share(t2, [a.lookup(b"a" + bytes([0]) * 31)])
    assert t2 == [t1[0]] and a.ref_count(t1[0]) == 2 and a.usage == 0.5
    a.free(t1)
    assert a.ref_count(t2[0]) == 1 and not a.is_free(t2[0]) and a.usage == 0.25
    check_invariants(a)
    a.free(t2)
    assert a.usage == 0.0 and a.num_free == 4 and a.num_cached == 2  # still cached
    check_invariants(a)


def test_freed_cached_blocks_are_evicted_least_recently_released_first():
    a = BlockAllocator(num_blocks=4, block_size=1)
    old = _cached_table(a, 2, b"o")
    new = _cached_table(a, 2, b"n")
    a.free(list(old))  # released first: evicted first, tail before head
    a.free(list(new))
    order: list[int] = []
    for _ in range(4):
        t: list[int] = []
        assert a.grow(t, 1)
        order += t
        check_invariants(a)
    assert order == [old[1], old[0], new[1], new[0]]
    assert a.num_cached == 0 and a.num_evicted == 4
    assert a.lookup(b"o" + bytes([0]) * 31) is None


def test_never_used_blocks_go_before_cached_ones():
    a = BlockAllocator(num_blocks=3, block_size=1)
    t = _cached_table(a, 1, b"c")
    a.free(list(t))
    fresh: list[int] = []
    assert a.grow(fresh, 2)
    assert t[0] not in fresh and a.num_cached == 1 and a.num_evicted == 0


def test_sharing_a_free_cached_block_takes_it_out_of_the_free_queue():
    a = BlockAllocator(num_blocks=2, block_size=1)
    t = _cached_table(a, 1, b"x")
    block = t[0]
    a.free(t)
    assert a.num_free == 2
    held: list[int] = []
    a.share(held, [block])
    assert a.num_free == 1 and a.ref_count(block) == 1
    other: list[int] = []
    assert a.grow(other, 1) and other != [block]  # the shared block is not handed out
    assert not a.grow(other, 2)
    check_invariants(a)


def test_cache_rules():
    a = BlockAllocator(num_blocks=3, block_size=1)
    t: list[int] = []
    a.grow(t, 3)
    h = b"h" * 32
    assert a.cache(t[0], h)
    assert not a.cache(t[1], h)  # the content already has a block: the first stays
    assert not a.cache(t[0], b"g" * 32)  # a block carries one hash
    assert a.lookup(h) == t[0] and a.num_cached == 1
    with pytest.raises(ValueError, match="not cached"):
        a.share([], [t[1]])
    second = t[1]
    a.free(t)
    with pytest.raises(ValueError, match="not in use"):
        a.cache(second, b"k" * 32)
    assert a.reset_cache() == 1 and a.lookup(h) is None


def test_random_operations_keep_the_invariants():
    import random

    rng = random.Random(7)
    a = BlockAllocator(num_blocks=24, block_size=2)
    tables: list[list[int]] = []
    for step in range(3000):
        op = rng.random()
        if op < 0.4:
            t: list[int] = []
            hits = [a.lookup(bytes([rng.randrange(8)]) * 32)]
            hits = [b for b in hits if b is not None and b not in t]
            a.share(t, hits)
            if a.grow(t, len(t) * 2 + rng.randrange(1, 7)):
                tables.append(t)
            else:
                a.free(t)
        elif op < 0.7 and tables:
            t = tables.pop(rng.randrange(len(tables)))
            a.free(t)
        elif tables:
            t = rng.choice(tables)
            a.cache(rng.choice(t), bytes([rng.randrange(8)]) * 32)
        if step % 500 == 0:
            a.reset_cache()
        check_invariants(a)
        held = sum(len(set(t)) for t in tables)
        assert held >= a.usage * a.num_blocks  # shared blocks are counted once
