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
- except with ``prompt_only``, when the model runs a position's rows on a kernel chosen by
  its role (engine/kernels/amx.py: prompt rows on the AMX tiles, generated rows on the
  AVX-512 GEMM): the same tokens then have different K/V as a prompt and as an output. A
  block is committed only when it lies inside its request's prompt, and a request takes
  only blocks inside its own prompt, so every shared block was computed as prompt rows
  and is read as prompt rows. A chat's next turn recomputes the previous answer (on the
  prompt kernel); a preempted request recomputes its output.
"""

from __future__ import annotations

from engine.kv.block_allocator import BlockAllocator
from engine.kv.block_hash import BlockHasher
from engine.request import Request


class PrefixCache:
    def __init__(self, allocator: BlockAllocator, kv_dtype: str = "bfloat16",
                 prompt_only: bool = False) -> None:
        self.allocator = allocator
        self.hasher = BlockHasher(allocator.block_size, kv_dtype)
        self.prompt_only = prompt_only

    def _prompt_blocks(self, req: Request, n: int) -> int:
        """n, capped at the full blocks inside the prompt when ``prompt_only``."""
        if not self.prompt_only:
            return n
        return min(n, len(req.prompt_ids) // self.allocator.block_size)

    def match(self, req: Request) -> list[int]:
        """The cached blocks that cover ``req``'s first tokens, in order (possibly none).
        Takes no reference: :meth:`BlockAllocator.share` does."""
        if req.wants_prompt_logprobs:
            return []
        bs = self.allocator.block_size
        limit = self._prompt_blocks(req, (req.num_tokens - 1) // bs)
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
        full = self._prompt_blocks(
            req, min(req.num_computed // self.allocator.block_size, len(req.block_table)))
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
            keys = None
            if req.images:
                from engine.vision.prompt_image import block_image_keys

                def keys(start: int, end: int) -> tuple[bytes, ...]:
                    return block_image_keys(req.images, start, end)
            self.hasher.extend(req.block_hashes, tokens, req.cache_salt, keys)
        return req.block_hashes
