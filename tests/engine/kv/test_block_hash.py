"""Chained block hashes: deterministic, chained, keyed by salt and KV dtype, and
unambiguous (no crafted token ids collide with another block's serialization)."""

import itertools

import pytest

from engine.kv.block_hash import DIGEST_BYTES, BlockHasher, block_hash, root_hash


def test_hash_is_deterministic_and_256_bits():
    h = block_hash(root_hash("bfloat16"), [1, 2, 3, 4])
    assert h == block_hash(root_hash("bfloat16"), (1, 2, 3, 4))
    assert isinstance(h, bytes) and len(h) == DIGEST_BYTES == 32


def test_chain_depends_on_every_earlier_block():
    hasher = BlockHasher(4)
    a = hasher.extend([], [1, 2, 3, 4, 5, 6, 7, 8])
    b = hasher.extend([], [9, 2, 3, 4, 5, 6, 7, 8])
    assert a[1] != b[1]  # same second block, different first block
    assert hasher.extend([], [1, 2, 3, 4]) == a[:1]


def test_extend_resumes_where_it_stopped():
    hasher = BlockHasher(4)
    whole = hasher.extend([], list(range(12)))
    part = hasher.extend([], list(range(4)))
    assert hasher.extend(part, list(range(4, 12))) == whole


def test_extend_refuses_partial_blocks():
    with pytest.raises(ValueError, match="whole blocks"):
        BlockHasher(4).extend([], [1, 2, 3])


def test_salt_and_kv_dtype_separate_otherwise_equal_blocks():
    tokens = [5, 6, 7, 8, 9, 10, 11, 12]
    plain = BlockHasher(4).extend([], tokens)
    salted = BlockHasher(4).extend([], tokens, salt="tenant-a")
    other = BlockHasher(4).extend([], tokens, salt="tenant-b")
    fp8 = BlockHasher(4, kv_dtype="float8_e4m3fn").extend([], tokens)
    assert len({plain[0], salted[0], other[0], fp8[0]}) == 4
    assert len({plain[1], salted[1], other[1], fp8[1]}) == 4  # carried down the chain


def test_crafted_inputs_do_not_collide():
    """Inputs a naive serialization would confuse: ids that concatenate to the same
    digits, an extra key that looks like token bytes, str vs bytes keys, 64-bit ids
    that alias modulo 2**32, and a block split differently between tokens and keys."""
    root = root_hash("bfloat16")
    cases = [
        ([12, 3], ()), ([1, 23], ()), ([123], ()),
        ([1, 2], ("3",)), ([1, 2, 3], ()), ([1, 2], (b"3",)), ([1, 2], ("3", "")),
        ([1, 2], ("", "3")), ([2**32 + 1], ()), ([1], ()), ([1, 0], ()), ([1], ("\0",)),
        ([0], ()), ([], ()), ([], ("",)),
    ]
    hashes = [block_hash(root, t, k) for t, k in cases]
    assert len(set(hashes)) == len(cases)
    many = {block_hash(root, list(t)) for t in itertools.product(range(8), repeat=4)}
    assert len(many) == 8**4


def test_parent_must_be_a_digest():
    with pytest.raises(ValueError, match="32 bytes"):
        block_hash(b"short", [1])
