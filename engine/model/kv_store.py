"""The paged KV tensors (the scheduler's engine/kv/block_allocator.py owns which sequence
holds which block; this module only owns the memory).

Layout: one bf16 tensor ``kv`` [num_layers, 2, num_blocks, block_size, num_kv_heads,
head_dim] (index 0 = K, 1 = V), preallocated and zero-filled (so padded reads in batched
decode never meet NaN garbage). A *slot* is ``block_id * block_size + offset``; per layer
the runner sees K and V as flat views [num_blocks * block_size, num_kv_heads, head_dim].
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import EngineConfig, ModelConfig

KV_DTYPE = torch.bfloat16
GIB = 1 << 30


def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype = KV_DTYPE) -> int:
    """K and V of every layer for one block of ``block_size`` tokens."""
    elem = torch.empty((), dtype=dtype).element_size()
    return config.kv_bytes_per_token(elem) * block_size


def num_blocks_for(config: ModelConfig, engine_config: EngineConfig) -> int:
    """How many blocks fit in ``engine_config.kv_cache_gib``; raises if not even one."""
    per_block = bytes_per_block(config, engine_config.kv_block_size)
    n = int(engine_config.kv_cache_gib * GIB) // per_block
    if n < 1:
        raise ValueError(
            f"kv_cache_gib {engine_config.kv_cache_gib} holds no KV block "
            f"({per_block} bytes per block of {engine_config.kv_block_size} tokens)"
        )
    return n


@dataclass(frozen=True, slots=True)
class KVStore:
    kv: torch.Tensor  # [L, 2, num_blocks, block_size, kv_heads, head_dim] bf16
    block_size: int

    @classmethod
    def allocate(cls, config: ModelConfig, num_blocks: int, block_size: int) -> KVStore:
        shape = (config.num_layers, 2, num_blocks, block_size, config.num_kv_heads,
                 config.head_dim)
        return cls(torch.zeros(shape, dtype=KV_DTYPE), block_size)

    @property
    def num_blocks(self) -> int:
        return int(self.kv.shape[2])

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def bytes_per_block(self) -> int:
        return self.kv[:, :, 0].numel() * self.kv.element_size()

    @property
    def nbytes(self) -> int:
        return self.kv.numel() * self.kv.element_size()

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(K, V) of layer ``i``, each a view [num_slots, kv_heads, head_dim] bf16."""
        kv = self.kv[i]
        return kv[0].flatten(0, 1), kv[1].flatten(0, 1)
