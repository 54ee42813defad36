"""Automatic prefix caching: a request starts from the longest run of full KV blocks that
an earlier (or running) request already computed for the same tokens.

The scheduler asks :meth:`PrefixCache.match` when it admits a request, and calls
:meth:`PrefixCache.commit` for running requests each step and before it frees one: every
full block whose K/V has been computed is registered under its chained content hash
(engine/kv/block_hash.py) in the allocator's index. The index and the reference counts
live in engine/kv/block_allocator.py; this module only decides which blocks to hash and
share.

Rules:
- only full blocks are shared, and never the block that would hold a request's last
  token: that token is always computed, because its logits are needed. So at most
  ``(num_tokens - 1) // block_size`` blocks match.
- a request that asks for prompt logprobs and has positions still to score bypasses the
  lookup (every prompt position must run through the model to be scored), but its blocks
  are still committed for others.
- a block that holds positions of an image is keyed by the image's content hash too
  (engine/vision/prompt_image.py): the same image reuses its KV across turns, two
  different images with the same [IMG] layout never share it.
- generated tokens count too: after a preemption a request recomputes its prompt and its
  output through the cache, and a chat's next turn can reuse the previous answer's blocks
  when the template reproduces its tokens.
- ``by_role``: when the model runs a position's rows on a kernel chosen by its role
  (engine/kernels/amx.py: prompt rows on the AMX tiles, generated rows on the AVX-512
  GEMM), the same tokens have different K/V as a prompt and as an output. Each block's
  key then also names how many of its positions are prompt positions (the chain carries
  the rest), so a block is shared only between requests that computed it in the same
  roles: a preempted request finds its own output again, and the prompt blocks of
  requests with a common prefix are shared as before, but a chat's next turn, whose
  prompt holds the previous answer, recomputes that answer (as prompt rows).
"""

from __future__ import annotations

from collections.abc import Callable

from engine.kv.block_allocator import BlockAllocator
from engine.kv.block_hash import BlockHasher
from engine.request import Request


class PrefixCache:
    def __init__(self, allocator: BlockAllocator, kv_dtype: str = "bfloat16",
                 by_role: bool = False) -> None:
        self.allocator = allocator
        self.hasher = BlockHasher(allocator.block_size, kv_dtype)
        self.by_role = by_role

    def match(self, req: Request) -> list[int]:
        """The cached blocks that cover ``req``'s first tokens, in order (possibly none).
        Takes no reference: :meth:`BlockAllocator.share` does."""
        if req.wants_prompt_logprobs:
            return []
        bs = self.allocator.block_size
        limit = (req.num_tokens - 1) // bs
        if limit == 0:
            return []
        hashes = self._hashes(req, limit)
        blocks: list[int] = []
        for h in hashes[:limit]:
            block = self.allocator.lookup(h)
            if block is None:
                break
            blocks.append(block)
        return blocks

    def commit(self, req: Request) -> None:
        """Register ``req``'s full blocks whose K/V is computed and not yet registered."""
        full = min(req.num_computed // self.allocator.block_size, len(req.block_table))
        if full <= req.num_committed_blocks:
            return
        hashes = self._hashes(req, full)
        for i in range(req.num_committed_blocks, full):
            self.allocator.cache(req.block_table[i], hashes[i])
        req.num_committed_blocks = full

    def _hashes(self, req: Request, num_blocks: int) -> list[bytes]:
        if len(req.block_hashes) < num_blocks:
            bs = self.allocator.block_size
            tokens = req.token_slice(len(req.block_hashes) * bs, num_blocks * bs)
            self.hasher.extend(req.block_hashes, tokens, req.cache_salt, self._keys(req))
        return req.block_hashes

    def _keys(self, req: Request) -> Callable[[int, int], tuple[bytes, ...]] | None:
        """The extra keys of the block at positions [start, end): its images' content
        hashes, and with ``by_role`` how many of its positions are the prompt's."""
        if not req.images and not self.by_role:
            return None
        prompt_len = len(req.prompt_ids)

        def keys(start: int, end: int) -> tuple[bytes, ...]:
            out: tuple[bytes, ...] = ()
            if req.images:
                from engine.vision.prompt_image import block_image_keys

                out = tuple(block_image_keys(req.images, start, end))
            if self.by_role:
                prompt_rows = min(end, max(start, prompt_len)) - start
                out += (b"prompt_rows:%d" % prompt_rows,)
            return out

        return keys
