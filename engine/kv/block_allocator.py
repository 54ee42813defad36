"""KV-cache block allocator: pure bookkeeping of block ids; the K/V tensors live in the
model runner (``ModelRunner.num_kv_blocks`` blocks of ``block_size`` tokens each).

A sequence owns a block table (a list of block ids, in position order); position ``p`` of
that sequence lives in block ``table[p // block_size]`` at offset ``p % block_size``.
"""

from __future__ import annotations

from collections import deque


class BlockAllocator:
    """Hands out block ids in ``[0, num_blocks)``; never blocks, never evicts."""

    def __init__(self, num_blocks: int, block_size: int) -> None:
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"need num_blocks >= 1 and block_size >= 1, got "
                             f"{num_blocks} and {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free: deque[int] = deque(range(num_blocks))
        self._used: set[int] = set()

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def usage(self) -> float:
        """Fraction of blocks in use, 0.0 .. 1.0 (vLLM's kv_cache_usage_perc)."""
        return len(self._used) / self.num_blocks

    def blocks_for(self, num_tokens: int) -> int:
        """Blocks needed to hold ``num_tokens`` positions."""
        return -(-num_tokens // self.block_size)

    def extra_blocks(self, table: list[int], num_tokens: int) -> int:
        """Blocks ``table`` must gain to hold ``num_tokens`` positions."""
        return max(0, self.blocks_for(num_tokens) - len(table))

    def can_grow(self, table: list[int], num_tokens: int) -> bool:
        return self.extra_blocks(table, num_tokens) <= self.num_free

    def grow(self, table: list[int], num_tokens: int) -> bool:
        """Extend ``table`` in place to cover ``num_tokens`` positions; False (and no
        change) when there are not enough free blocks."""
        need = self.extra_blocks(table, num_tokens)
        if need > len(self._free):
            return False
        for _ in range(need):
            block = self._free.popleft()
            self._used.add(block)
            table.append(block)
        return True

    def free(self, table: list[int]) -> None:
        """Return every block of ``table`` and empty it."""
        for block in table:
            if block not in self._used:
                raise ValueError(f"block {block} freed twice or never allocated")
            self._used.remove(block)
            self._free.append(block)
        table.clear()
