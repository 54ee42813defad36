"""Test-side conversions between slot-major K/V (what references index: [S, Hkv, D], row
``slot``) and the paged cache layout every op takes ([num_blocks, Hkv, block_size, D],
engine/model/kv_store.py; scales [S, Hkv] <-> [num_blocks, Hkv, block_size]).

Written independently of kv_store.kv_rows (a reshape and a transpose), so the tests that
compare through them check that formula and the C++ kv_row too.
"""

from __future__ import annotations

import torch


def blocks_of(x: torch.Tensor, block_size: int) -> torch.Tensor:
    """[S, Hkv, ...] slot-major -> [S / block_size, Hkv, block_size, ...] contiguous."""
    s, hkv = x.shape[:2]
    assert s % block_size == 0, (s, block_size)
    return x.reshape(s // block_size, block_size, hkv, *x.shape[2:]).transpose(1, 2).contiguous()


def slots_of(c: torch.Tensor) -> torch.Tensor:
    """[num_blocks, Hkv, block_size, ...] -> [num_blocks * block_size, Hkv, ...] slot-major."""
    b, hkv, bs = c.shape[:3]
    return c.transpose(1, 2).reshape(b * bs, hkv, *c.shape[3:])
