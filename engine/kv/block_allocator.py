"""KV-cache block allocator: pure bookkeeping of block ids; the K/V tensors live in the
model runner (``ModelRunner.num_kv_blocks`` blocks of ``block_size`` tokens each).

A sequence owns a block table (a list of block ids, in position order); position ``p`` of
that sequence lives in block ``table[p // block_size]`` at offset ``p % block_size``.

Blocks are reference-counted: a full block whose content hash is registered
(:meth:`BlockAllocator.cache`) can be shared by every sequence whose prefix matches it
(engine/kv/prefix_cache.py). When its last holder lets go, a cached block keeps its K/V
and its hash and joins the free queue: it is evictable, least recently released first,
and is only overwritten when a new allocation takes it (which drops its hash). So the
prefix cache lives inside the KV memory, with no second copy. Invariants (tested):

- a block is either free (reference count 0, in the free queue) or in use (count >= 1,
  not in the queue), never both;
- a hash names at most one block and a block carries at most one hash.
"""

from __future__ import annotations

from collections import OrderedDict

BlockHash = bytes


class BlockAllocator:
    """Hands out block ids in ``[0, num_blocks)``; never blocks. Allocation takes the
    head of the free queue: never-used blocks first, then released ones in release order
    (so the least recently used cached block is the one evicted)."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got "
                             f"{num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self._refs = [0] * num_blocks
        self._num_used = 0
        self._by_hash: dict[BlockHash, int] = {}
        self._hash_of: dict[int, BlockHash] = {}
        self.num_evicted = 0  # cached blocks overwritten by an allocation

    @property
    def num_free(self) -> int:
        """Blocks an allocation can take now, cached-but-unused ones included."""
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks held by sequences, 0.0 .. 1.0 (vLLM's kv_cache_usage_perc:
        cached blocks no sequence holds count as free)."""
        return self._num_used / self.num_blocks

    @property
    def num_cached(self) -> int:
        """Blocks that carry a content hash (in use or free)."""
        return len(self._hash_of)

    def ref_count(self, block: int) -> int:
        return self._refs[block]

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` positions."""
        return -(-num_tokens // self.block_size)

    def extra_blocks(self, table: list[int], num_tokens: int) -> int:
        """Blocks ``table`` must gain to hold ``num_tokens`` positions."""
        return max(0, self.blocks_for(num_tokens) - len(table))

    def grow(self, table: list[int], num_tokens: int) -> bool:
        """Extend ``table`` in place with fresh blocks to cover ``num_tokens`` positions;
        False (and no change) when there are not enough free blocks."""
        need = self.extra_blocks(table, num_tokens)
        if need > len(self._free):
            return False
        for _ in range(need):
            block, _ = self._free.popitem(last=False)
            self._evict(block)
            self._take(block)
            table.append(block)
        return True

    def shrink(self, table: list[int], num_tokens: int) -> int:
        """Release ``table``'s blocks past those ``num_tokens`` positions need (the tail a
        rejected speculative draft was written into); returns how many were released."""
        keep = self.blocks_for(num_tokens)
        tail = table[keep:]
        if tail:
            del table[keep:]
            self.free(tail)
        return len(tail)

    def share(self, table: list[int], blocks: list[int]) -> None:
        """Append cached ``blocks`` (from :meth:`lookup`) to ``table``, taking a reference
        on each (a free one leaves the free queue)."""
        for block in blocks:
            if block not in self._hash_of:
                raise ValueError(f"block {block} is not cached")
            if self._refs[block] == 0:
                del self._free[block]
            self._take(block)
            table.append(block)

    def free(self, table: list[int]) -> None:
        """Release every block of ``table`` and empty it. A block nobody else holds joins
        the free queue, the table's last block first: a sequence's tail is evicted before
        its head, which other prefixes may still match."""
        for block in reversed(table):
            if self._refs[block] < 1:
                raise ValueError(f"block {block} freed twice or never allocated")
            self._refs[block] -= 1
            if self._refs[block] == 0:
                self._num_used -= 1
                self._free[block] = None
        table.clear()

    def _take(self, block: int) -> None:
        if self._refs[block] == 0:
            self._num_used += 1
        self._refs[block] += 1

    # ---- content hashes (the prefix cache's index) ---------------------------------------

    def lookup(self, block_hash: BlockHash) -> int | None:
        """The block holding the content named by ``block_hash``, or None."""
        return self._by_hash.get(block_hash)

    def is_free(self, block: int) -> bool:
        return self._refs[block] == 0

    def cache(self, block: int, block_hash: BlockHash) -> bool:
        """Register the full, computed ``block`` (held by a sequence) under its content
        hash. False when that content is already cached in another block (the first one
        stays the shared copy) or ``block`` already carries a hash."""
        if self._refs[block] < 1:
            raise ValueError(f"block {block} is not in use: only a held block can be cached")
        if block_hash in self._by_hash or block in self._hash_of:
            return False
        self._by_hash[block_hash] = block
        self._hash_of[block] = block_hash
        return True

    def reset_cache(self) -> int:
        """Forget every content hash (the blocks and their holders are unchanged; nothing
        is shared from here on until new blocks are cached). Returns how many were
        dropped."""
        n = len(self._hash_of)
        self._by_hash.clear()
        self._hash_of.clear()
        return n

    def _evict(self, block: int) -> None:
        """An allocation takes ``block``: its cached content, if any, is gone."""
        h = self._hash_of.pop(block, None)
        if h is not None:
            del self._by_hash[h]
            self.num_evicted += 1
