"""Content hashes of full KV blocks, chained: a block's hash names its tokens *and*
everything before them, so two sequences share a block only when they share the whole
prefix up to its end.

``hash(block i) = blake2b-256(hash(block i-1) || len(tokens) || tokens || extra keys)``,
with ``hash(block -1)`` a root that names the KV cache's dtype. Every field has a fixed
width or a length prefix, so no two different inputs serialize to the same bytes: a
collision would need a blake2b collision, whatever token ids a client sends. Extra keys
are the things besides token ids that change a block's K/V: the request's ``cache_salt``
(first block only; the chain carries it), and image content hashes for blocks that hold
image positions (engine/vision, when images are served).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Sequence

from engine.kv.block_allocator import BlockHash

DIGEST_BYTES = 32  # blake2b-256


def _digest(*parts: bytes) -> BlockHash:
    h = hashlib.blake2b(digest_size=DIGEST_BYTES)
    for part in parts:
        h.update(part)
    return h.digest()


def root_hash(kv_dtype: str) -> BlockHash:
    """The parent of every sequence's first block: blocks of caches with different K/V
    dtypes never match."""
    name = kv_dtype.encode()
    return _digest(b"fp8serve.kv.root", struct.pack("<I", len(name)), name)


def block_hash(parent: BlockHash, token_ids: Sequence[int],
               extra_keys: Sequence[str | bytes] = ()) -> BlockHash:
    """The hash of one full block: ``parent`` (32 bytes), its ``token_ids`` (each a
    non-negative int below 2**63) and its ``extra_keys`` in order."""
    if len(parent) != DIGEST_BYTES:
        raise ValueError(f"parent hash must be {DIGEST_BYTES} bytes, got {len(parent)}")
    parts = [parent, struct.pack("<I", len(token_ids)),
             struct.pack(f"<{len(token_ids)}q", *token_ids), struct.pack("<I", len(extra_keys))]
    for key in extra_keys:
        raw = key.encode() if isinstance(key, str) else bytes(key)
        parts += [b"s" if isinstance(key, str) else b"b", struct.pack("<I", len(raw)), raw]
    return _digest(*parts)


class BlockHasher:
    """Hashes a sequence's full blocks of ``block_size`` tokens, chained from the root of
    ``kv_dtype``."""

    def __init__(self, block_size: int, kv_dtype: str = "bfloat16") -> None:
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.root = root_hash(kv_dtype)

    def extend(self, hashes: list[BlockHash], token_ids: Sequence[int],
               salt: str | None = None,
               block_keys: Callable[[int, int], Sequence[bytes]] | None = None
               ) -> list[BlockHash]:
        """Append to ``hashes`` (a sequence's first block hashes, in order) the hashes of
        the full blocks in ``token_ids``, the tokens that follow those blocks (a multiple
        of ``block_size`` of them); returns ``hashes``. ``salt`` keys the first block;
        ``block_keys(start, end)`` gives the extra keys of the block holding sequence
        positions [start, end) (the content hashes of the images there)."""
        bs = self.block_size
        if len(token_ids) % bs:
            raise ValueError(f"{len(token_ids)} tokens are not whole blocks of {bs}")
        for j in range(0, len(token_ids), bs):
            i = len(hashes)
            parent = hashes[i - 1] if i else self.root
            extra: list[str | bytes] = [salt] if i == 0 and salt is not None else []
            if block_keys is not None:
                extra += block_keys(i * bs, (i + 1) * bs)
            hashes.append(block_hash(parent, token_ids[j:j + bs], extra))
        return hashes
