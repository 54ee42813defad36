"""The paged KV tensors (the scheduler's engine/kv/block_allocator.py owns which sequence
holds which block; this module only owns the memory).

Layout: one tensor ``kv`` [num_layers, 2, num_blocks, num_kv_heads, block_size, head_dim]
(index 0 = K, 1 = V), preallocated and zero-filled (so padded reads in batched decode
never meet NaN garbage), bf16 or float8_e4m3fn (``--kv-cache-dtype fp8``). An fp8 store
also holds ``scales`` [num_layers, 2, num_blocks, num_kv_heads, block_size] fp32, the
dequant multiplier of each (token, KV head) row: K ~= scale * e4m3 (see :func:`quantize_kv`).
A *slot* is ``block_id * block_size + offset``; per layer the runner sees K and V as views
[num_blocks, num_kv_heads, block_size, head_dim] (scales [num_blocks, num_kv_heads,
block_size]), the layout every C++ op takes (ext/csrc/attention.h ``kv_row``).

Why KV heads outside the block's tokens: decode attention walks one KV head's keys, and
this way they lie in runs of block_size rows (4 KiB for 16 bf16 rows of 128) instead of
rows a whole token (all heads) apart. On the 8B shape at 16384 keys the AVX2 kernel reads
its K/V 2.1x faster so (``fp8serve bench kv-cache``; README).

Why per (token, KV head) scales: a token's stored bytes then depend on its own K/V only,
never on which tokens share its block or how the prompt was chunked (batch and chunk
invariance hold by construction), and each 128-wide row gets its own range. They cost 4
bytes per 128 (3%). A checkpoint's static per-layer ``k_scale`` / ``v_scale`` replace the
computed ones (the same value is then stored in every row's scale).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from engine.config import EngineConfig, ModelConfig

KV_DTYPE = torch.bfloat16
KV_FP8 = torch.float8_e4m3fn
E4M3_MAX = 448.0
TINY_AMAX = 1e-30  # a row whose |max| is below this gets scale 1 (stores zeros)
GIB = 1 << 30


def kv_torch_dtype(name: str) -> torch.dtype:
    """EngineConfig.kv_cache_dtype ("auto" | "bf16" | "fp8") -> the K/V element type."""
    dtypes = {"auto": KV_DTYPE, "bf16": KV_DTYPE, "fp8": KV_FP8}
    if name not in dtypes:
        raise ValueError(f"kv_cache_dtype {name!r} is not one of {', '.join(dtypes)}")
    return dtypes[name]


def bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype = KV_DTYPE) -> int:
    """K and V of every layer for one block of ``block_size`` tokens (fp8: plus the fp32
    scale of each (token, layer, K/V, KV head) row)."""
    elem = torch.empty((), dtype=dtype).element_size()
    per_token = config.kv_bytes_per_token(elem)
    if dtype == KV_FP8:
        per_token += 2 * config.num_layers * config.num_kv_heads * 4
    return per_token * block_size


def num_blocks_for(config: ModelConfig, engine_config: EngineConfig) -> int:
    """How many blocks fit in ``engine_config.kv_cache_gib``; raises if not even one."""
    dtype = kv_torch_dtype(engine_config.kv_cache_dtype)
    per_block = bytes_per_block(config, engine_config.kv_block_size, dtype)
    n = int(engine_config.kv_cache_gib * GIB) // per_block
    if n < 1:
        raise ValueError(
            f"--kv-cache-gib {engine_config.kv_cache_gib:g} holds no KV block "
            f"({per_block} bytes per block of {engine_config.kv_block_size} tokens)"
        )
    return n


def quantize_kv(x: torch.Tensor, static: float = 0.0) -> tuple[torch.Tensor, torch.Tensor]:
    """x [T, Hkv, D] bf16 -> (q [T, Hkv, D] float8_e4m3fn, s [T, Hkv] fp32), x ~= s * q.
    s = ``static`` if > 0, else amax over D / 448 (1 below TINY_AMAX). The reference of
    the C++ kv_write_fp8 (ext/csrc/kv_fp8.cpp): same fp32 steps, same bytes."""
    xf = x.float()
    if static > 0:
        s = torch.full(xf.shape[:2], static, dtype=torch.float32)
    else:
        amax = xf.abs().amax(dim=-1)
        s = torch.where(amax < TINY_AMAX, torch.ones_like(amax), amax / E4M3_MAX)
    q = (xf / s[..., None]).clamp(-E4M3_MAX, E4M3_MAX).to(KV_FP8)
    return q, s


def dequantize_kv(q: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    """q [N, Hkv, D] float8_e4m3fn, s [N, Hkv] fp32 -> [N, Hkv, D] fp32."""
    return q.float() * s[..., None]


def kv_rows(slots: torch.Tensor, num_kv_heads: int, block_size: int) -> torch.Tensor:
    """slots [S] int64 -> [S, Hkv] int64, the row of each (slot, KV head) in a cache viewed
    as [num_blocks * Hkv * block_size, D] (C++: attention.h ``kv_row``)."""
    block, offset = slots // block_size, slots % block_size
    heads = torch.arange(num_kv_heads, dtype=torch.int64)
    return (block[:, None] * num_kv_heads + heads) * block_size + offset[:, None]


class LayerKV(NamedTuple):
    """One layer's cache views: k, v [num_blocks, Hkv, block_size, D] (bf16 or
    float8_e4m3fn); for fp8 k_scale, v_scale [num_blocks, Hkv, block_size] fp32 and the
    static scales (0 = per row)."""

    k: torch.Tensor
    v: torch.Tensor
    k_scale: torch.Tensor | None = None
    v_scale: torch.Tensor | None = None
    k_static: float = 0.0
    v_static: float = 0.0

    @property
    def fp8(self) -> bool:
        return self.k_scale is not None

    def rows(self, slots: torch.Tensor) -> torch.Tensor:
        """slots [S] int64 -> [S * Hkv] int64 rows of the flat [-1, D] views (:func:`kv_rows`)."""
        return kv_rows(slots, self.k.shape[1], self.k.shape[2]).flatten()

    def gather(self, slots: torch.Tensor, k_out: torch.Tensor | None = None,
               v_out: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """bf16 caches: slots [S] -> K, V [S, Hkv, D] (into k_out / v_out when given)."""
        rows, (_, hkv, _, d) = self.rows(slots), self.k.shape
        out = []
        for c, o in ((self.k, k_out), (self.v, v_out)):
            dst = None if o is None else o.view(-1, d)
            out.append(torch.index_select(c.view(-1, d), 0, rows, out=dst).view(-1, hkv, d))
        return out[0], out[1]

    def scatter(self, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """bf16 caches: k, v [S, Hkv, D] -> the rows of slots [S] (the kv_write op's twin)."""
        rows, d = self.rows(slots), self.k.shape[-1]
        self.k.view(-1, d).index_copy_(0, rows, k.reshape(-1, d))
        self.v.view(-1, d).index_copy_(0, rows, v.reshape(-1, d))


@dataclass(frozen=True, slots=True)
class KVStore:
    kv: torch.Tensor  # [L, 2, num_blocks, kv_heads, block_size, head_dim] bf16 | e4m3
    block_size: int
    scales: torch.Tensor | None = None  # [L, 2, num_blocks, kv_heads, block_size] fp32
    static_scales: tuple[tuple[float, float], ...] | None = None  # per layer (k, v)

    @classmethod
    def allocate(cls, config: ModelConfig, num_blocks: int, block_size: int,
                 dtype: torch.dtype = KV_DTYPE,
                 static_scales: tuple[tuple[float, float], ...] | None = None) -> KVStore:
        if dtype not in (KV_DTYPE, KV_FP8):
            raise ValueError(f"KV dtype {dtype} is neither bfloat16 nor float8_e4m3fn")
        if static_scales is not None and (dtype != KV_FP8 or
                                          len(static_scales) != config.num_layers):
            raise ValueError("static KV scales need an fp8 store and one (k, v) per layer")
        rows = (config.num_layers, 2, num_blocks, config.num_kv_heads, block_size)
        scales = torch.ones(rows, dtype=torch.float32) if dtype == KV_FP8 else None
        return cls(torch.zeros((*rows, config.head_dim), dtype=dtype), block_size, scales,
                   static_scales)

    @property
    def num_blocks(self) -> int:
        return int(self.kv.shape[2])

    @property
    def num_slots(self) -> int:
        return self.num_blocks * self.block_size

    @property
    def bytes_per_block(self) -> int:
        return self.nbytes // self.num_blocks

    @property
    def nbytes(self) -> int:
        extra = 0 if self.scales is None else self.scales.numel() * 4
        return self.kv.numel() * self.kv.element_size() + extra

    def layer(self, i: int) -> LayerKV:
        """Layer ``i``'s views: K, V [num_blocks, kv_heads, block_size, head_dim] (+ fp8
        scales [num_blocks, kv_heads, block_size])."""
        kv = self.kv[i]
        if self.scales is None:
            return LayerKV(kv[0], kv[1])
        sc = self.scales[i]
        ks, vs = self.static_scales[i] if self.static_scales else (0.0, 0.0)
        return LayerKV(kv[0], kv[1], sc[0], sc[1], ks, vs)


def write_fp8_rows(cache: LayerKV, k: torch.Tensor, v: torch.Tensor,
                   slots: torch.Tensor) -> None:
    """Reference (torch) twin of the kv_write_fp8 op: k, v [T, Hkv, D] bf16 -> quantized
    into cache rows ``slots`` [T] int64 (the SDPA path and tests)."""
    assert cache.k_scale is not None and cache.v_scale is not None
    rows, d = cache.rows(slots), cache.k.shape[-1]
    for x, c, s, static in ((k, cache.k, cache.k_scale, cache.k_static),
                            (v, cache.v, cache.v_scale, cache.v_static)):
        q, sc = quantize_kv(x, static)
        c.view(torch.uint8).view(-1, d).index_copy_(0, rows, q.view(torch.uint8).reshape(-1, d))
        s.view(-1).index_copy_(0, rows, sc.flatten())


def read_fp8_rows(cache: LayerKV, slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``slots`` [S] int64 of an fp8 cache -> K, V [S, Hkv, D] bf16 (dequantized in
    fp32, rounded once)."""
    assert cache.k_scale is not None and cache.v_scale is not None
    rows, (_, hkv, _, d) = cache.rows(slots), cache.k.shape
    out = []
    for c, s in ((cache.k, cache.k_scale), (cache.v, cache.v_scale)):
        q = c.view(torch.uint8).view(-1, d).index_select(0, rows).view(KV_FP8).view(-1, hkv, d)
        sc = s.view(-1).index_select(0, rows).view(-1, hkv)
        out.append(dequantize_kv(q, sc).to(torch.bfloat16))
    return out[0], out[1]
