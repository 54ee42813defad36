"""Paged causal attention over the KV store, for a mixed batch of prefill chunks and
decode tokens.

Per step the runner builds one :class:`AttentionMetadata` (slot indices, block tables)
shared by every layer. Per layer, :class:`PagedAttention` writes the new tokens' K/V into
their slots, then either

* (C++ extension built) runs every query token - prefill and decode alike - through the
  ``paged_attention`` op (ext/csrc/attention.cpp): K/V read straight from the paged
  blocks, fp32 online softmax over keys in position order. Each query row's result is
  bitwise independent of the batch composition and of how its prompt was chunked
  (measured on 2 Zen 4 cores: decode 1.7-2x faster than SDPA on pre-gathered K/V; a
  512-token prefill chunk of a 3B-shaped layer about as fast as causal SDPA, 27 vs 28 ms,
  with the (token, head) items split dynamically over the threads); or
* (reference path) runs each prefill chunk (> 1 token) with SDPA over [cached context +
  chunk], causal, and all decode chunks together: one gather of each sequence's K/V into
  a reused padded buffer, a length mask, one SDPA call with the query heads of each KV
  head folded into the query-length axis. Here padding to the longest context changes
  SDPA's reduction order, so a sequence's logits depend on its batch.

Shapes: T = tokens in the step, Hq/Hkv = query/KV heads, D = head_dim, B = decode
sequences, L = context length. q [T, Hq, D], k/v [T, Hkv, D] bf16 -> out [T, Hq*D] bf16.
KV cache per layer: K, V [num_blocks, Hkv, block_size, D] bf16, or float8_e4m3fn with fp32
scales [num_blocks, Hkv, block_size] (a kv_store.LayerKV; --kv-cache-dtype fp8; a slot's
row is kv_store.kv_rows, a KV head's rows of one block adjacent): the C++ path writes
with kv_write_fp8 and paged_attention converts K/V in its kernel; the SDPA path quantizes
and dequantizes with kv_store's torch reference.
paged_attention inputs (PagedIndex): block_tables [C, W] int32 (C = chunks), token_seq [T]
int32 (each token's chunk), ctx_lens [T] int32 (keys attended = position + 1).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.batch import BatchInputs
from engine.model.kv_store import LayerKV, read_fp8_rows, write_fp8_rows


@dataclass(frozen=True, slots=True)
class PrefillSpan:
    start: int  # first row of the chunk in the flattened step tokens
    end: int
    ctx_slots: torch.Tensor | None  # [start_pos + n] int64; None when start_pos == 0
    mask: torch.Tensor | None  # [n, start_pos + n] bool (True = attend); None if start 0


@dataclass(frozen=True, slots=True)
class DecodeSpan:
    rows: torch.Tensor  # [B] int64 rows of the decode tokens in the step
    slots: torch.Tensor  # [B * L_max] int64 context slots, padded with slot 0
    mask: torch.Tensor  # [B, 1, 1, L_max] bool (True = attend)
    max_len: int


@dataclass(frozen=True, slots=True)
class PagedIndex:
    """Inputs of the C++ paged_attention op, shared by every layer of the step."""

    block_tables: torch.Tensor  # [C, W] int32 block ids (zero padded)
    token_seq: torch.Tensor  # [T] int32 row of block_tables for each token
    ctx_lens: torch.Tensor  # [T] int32 keys attended by each token (position + 1)
    block_size: int


@dataclass(frozen=True, slots=True)
class AttentionMetadata:
    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64 where each new token's K/V is written
    prefills: tuple[PrefillSpan, ...]  # empty unless built with spans=True
    decode: DecodeSpan | None
    paged: PagedIndex
    # uint8 [T]: 1 for a generated row (BatchInputs.generated_rows), the rows a layer with a
    # generated-rows kernel runs on it; None when every row is a prompt row
    generated_rows: torch.Tensor | None = None


def _block_tables(batch: BatchInputs, block_size: int, num_slots: int) -> list[list[int]]:
    """[C][max_blocks] block ids, zero-padded; checks each table covers its context and
    names blocks inside the store."""
    width = max(1, max(len(c.block_table) for c in batch.chunks))
    rows = []
    for c in batch.chunks:
        need = -(-(c.start_pos + c.num_tokens) // block_size)
        if len(c.block_table) < need:
            raise ValueError(f"seq {c.seq_id}: block_table has {len(c.block_table)} blocks, "
                             f"{need} needed for {c.start_pos + c.num_tokens} tokens")
        if c.block_table and (min(c.block_table) < 0 or
                              (max(c.block_table) + 1) * block_size > num_slots):
            raise ValueError(f"block id outside the KV store ({num_slots // block_size} blocks)")
        rows.append([*c.block_table, *[0] * (width - len(c.block_table))])
    return rows


def _slots(bt_rows: torch.Tensor, pos: torch.Tensor, block_size: int) -> torch.Tensor:
    """bt_rows [..., max_blocks], pos [..., P] -> slots [..., P] int64."""
    return torch.gather(bt_rows, -1, pos // block_size) * block_size + pos % block_size


def build_metadata(batch: BatchInputs, block_size: int, num_slots: int,
                   spans: bool = True, roles: bool = True) -> AttentionMetadata:
    """The step's attention inputs; ``spans=False`` skips the SDPA path's spans and masks
    (enough for the C++ op), ``roles=False`` the row roles (generated_rows: None; for a
    model whose kernels are the same for every row). Index lists are built in Python and
    turned into tensors once each: tiny torch ops (repeat_interleave, cumsum) cost an
    OpenMP region per call."""
    if not batch.chunks:
        raise ValueError("empty batch")
    rows = _block_tables(batch, block_size, num_slots)
    positions: list[int] = []
    slots: list[int] = []
    chunk_of: list[int] = []
    for i, c in enumerate(batch.chunks):
        table, end = c.block_table, c.start_pos + c.num_tokens
        positions += range(c.start_pos, end)
        slots += [table[p // block_size] * block_size + p % block_size
                  for p in range(c.start_pos, end)]
        chunk_of += [i] * c.num_tokens
    pos = torch.tensor(positions, dtype=torch.int64)
    slot_mapping = torch.tensor(slots, dtype=torch.int64)
    paged = PagedIndex(torch.tensor(rows, dtype=torch.int32),
                       torch.tensor(chunk_of, dtype=torch.int32),
                       torch.tensor([p + 1 for p in positions], dtype=torch.int32), block_size)
    generated = batch.generated_rows() if roles else None
    if not spans:
        return AttentionMetadata(pos, slot_mapping, (), None, paged, generated)
    bt = torch.tensor(rows, dtype=torch.int64)
    counts = [c.num_tokens for c in batch.chunks]
    offsets = torch.tensor([sum(counts[:i]) for i in range(len(counts))], dtype=torch.int64)
    starts = [c.start_pos for c in batch.chunks]
    prefills, dec_idx = [], []
    for i, c in enumerate(batch.chunks):
        if c.num_tokens == 1:
            dec_idx.append(i)
            continue
        row = int(offsets[i])
        prefills.append(_prefill_span(row, c.start_pos, c.num_tokens, bt[i], block_size))
    decode = _decode_span(dec_idx, offsets, starts, bt, block_size) if dec_idx else None
    return AttentionMetadata(pos, slot_mapping, tuple(prefills), decode, paged, generated)


def _prefill_span(row: int, start: int, n: int, bt_row: torch.Tensor,
                  block_size: int) -> PrefillSpan:
    if start == 0:
        return PrefillSpan(row, row + n, None, None)
    ctx = torch.arange(start + n)
    mask = ctx[None, :] <= (start + torch.arange(n))[:, None]
    return PrefillSpan(row, row + n, _slots(bt_row, ctx, block_size), mask)


def _decode_span(idx: list[int], offsets: torch.Tensor, starts: list[int], bt: torch.Tensor,
                 block_size: int) -> DecodeSpan:
    sel = torch.tensor(idx, dtype=torch.int64)
    lens = torch.tensor([starts[i] + 1 for i in idx], dtype=torch.int64)
    max_len = int(lens.max())
    ar = torch.arange(max_len)
    valid = ar[None, :] < lens[:, None]  # [B, L_max]
    pos = torch.where(valid, ar[None, :], 0)
    slots = torch.where(valid, _slots(bt[sel], pos, block_size), 0)
    return DecodeSpan(offsets[sel], slots.reshape(-1), valid[:, None, None, :], max_len)


AVX512_ISAS = ("avx512", "avx512_vbmi", "amx")


def extension_attention_reason(num_heads: int, num_kv_heads: int, head_dim: int) -> str | None:
    """None when the C++ paged_attention op can run this model here, else why not."""
    import ext

    st = ext.load()
    if not st.built:
        return f"C++ extension not built: {st.error}"
    if not hasattr(torch.ops.fp8serve, "paged_attention"):
        return "C++ extension has no paged_attention op"
    if head_dim % 32 or head_dim > 256 or num_heads // num_kv_heads > 16:
        return f"head_dim {head_dim} / group {num_heads // num_kv_heads} not supported"
    # AVX2 hosts run its AVX2 kernel (bf16 and fp8 caches), hosts without AVX2 its
    # portable one (slower than SDPA); both keep the batch and chunk invariance that
    # SDPA's shape-dependent blocking loses (greedy outputs alone = batched = chunked =
    # from the prefix cache)
    return None


class PagedAttention:
    """Attention of one model (shared by its layers). ``use_ext``: run the C++ op (None =
    whenever it is available). The SDPA path owns only reusable gather buffers (grown on
    demand, never shrunk) so decode does not page-fault fresh memory each step."""

    def __init__(self, num_heads: int, num_kv_heads: int, head_dim: int,
                 use_ext: bool | None = None) -> None:
        self.hq, self.hkv, self.d = num_heads, num_kv_heads, head_dim
        self.group = num_heads // num_kv_heads
        self.scale = head_dim ** -0.5
        self._buf: dict[str, torch.Tensor] = {}
        # why the C++ op does not run (None when it does); turn_off names another reason
        self.off_reason: str | None = None
        if use_ext is None:
            self.off_reason = extension_attention_reason(num_heads, num_kv_heads, head_dim)
            use_ext = self.off_reason is None
        self.use_ext = use_ext

    def turn_off(self, why: str) -> None:
        """Run torch SDPA instead of the C++ op from now on (``why``: for the report)."""
        self.use_ext, self.off_reason = False, why

    def describe(self) -> dict[str, object]:
        """The attention part of the kernel report: ``{"path": "paged" | "sdpa",
        "reason": str | None, "batch_invariant": bool}``. The C++ op keeps one reduction
        order per row whatever the batch; SDPA's blocking follows the batch and chunk
        shapes, so a row's bits may change with them."""
        if self.use_ext:
            return {"path": "paged", "reason": None, "batch_invariant": True}
        return {"path": "sdpa", "reason": self.off_reason or "turned off",
                "batch_invariant": False}

    def _scratch(self, name: str, rows: int) -> torch.Tensor:
        buf = self._buf.get(name)
        if buf is None or buf.shape[0] < rows:
            buf = torch.empty(rows, self.hkv, self.d, dtype=torch.bfloat16)
            self._buf[name] = buf
        return buf[:rows]

    def _gather(self, cache: LayerKV,
                slots: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """slots [S] -> K, V [S, Hkv, D] in the reused buffers."""
        if cache.fp8:
            return read_fp8_rows(cache, slots)
        n = int(slots.shape[0])
        return cache.gather(slots, self._scratch("k", n), self._scratch("v", n))

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 cache: LayerKV,
                 meta: AttentionMetadata) -> torch.Tensor:
        """q [T, Hq, D], k/v [T, Hkv, D] bf16 (unit stride on D) -> [T, Hq*D] bf16."""
        fp8 = cache.fp8
        if self.use_ext:
            return self._ext(q, k, v, cache, meta, fp8)
        if fp8:  # the rows as stored: the chunk's own K/V round-trip through e4m3 too
            write_fp8_rows(cache, k, v, meta.slot_mapping)
            k, v = read_fp8_rows(cache, meta.slot_mapping)
        else:
            cache.scatter(meta.slot_mapping, k, v)
        t = q.shape[0]
        if meta.decode is None and len(meta.prefills) == 1:
            return self._prefill(q, k, v, cache, meta.prefills[0]).reshape(t, -1)
        if not meta.prefills and meta.decode is not None:  # pure decode: rows 0..B-1
            return self._decode(q, cache, meta.decode).reshape(t, -1)
        out = torch.empty(t, self.hq, self.d, dtype=q.dtype)
        for span in meta.prefills:
            out[span.start:span.end] = self._prefill(q, k, v, cache, span)
        if meta.decode is not None:
            out.index_copy_(0, meta.decode.rows, self._decode(q, cache, meta.decode))
        return out.view(t, -1)

    def _ext(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cache: LayerKV,
             meta: AttentionMetadata, fp8: bool) -> torch.Tensor:
        """The C++ ops: K/V write (fp8: quantized per row) then paged_attention."""
        ops, p = torch.ops.fp8serve, meta.paged
        if not fp8:
            ops.kv_write(cache[0], cache[1], k, v, meta.slot_mapping)
            return ops.paged_attention(q, cache[0], cache[1], p.block_tables, p.token_seq,
                                       p.ctx_lens, p.block_size, self.scale)
        ops.kv_write_fp8(cache.k, cache.v, cache.k_scale, cache.v_scale, k, v,
                         meta.slot_mapping, cache.k_static, cache.v_static)
        return ops.paged_attention(q, cache.k, cache.v, p.block_tables, p.token_seq,
                                   p.ctx_lens, p.block_size, self.scale, cache.k_scale,
                                   cache.v_scale)

    def _prefill(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 cache: LayerKV, span: PrefillSpan) -> torch.Tensor:
        """One chunk -> [n, Hq, D]. Inputs are 4-D [1, heads, len, D]: with 3-D ones torch
        falls back to its unfused math path."""
        qs = q[span.start:span.end].transpose(0, 1)[None]  # [1, Hq, n, D]
        if span.ctx_slots is None:
            ks, vs = k[span.start:span.end], v[span.start:span.end]
        else:
            ks, vs = self._gather(cache, span.ctx_slots)
        o = F.scaled_dot_product_attention(
            qs, ks.transpose(0, 1)[None], vs.transpose(0, 1)[None], attn_mask=span.mask,
            is_causal=span.mask is None, scale=self.scale, enable_gqa=self.group > 1)
        return o[0].transpose(0, 1)

    def _decode(self, q: torch.Tensor, cache: LayerKV,
                span: DecodeSpan) -> torch.Tensor:
        """All decode tokens -> [B, Hq, D]. Query heads sharing a KV head ride along the
        query-length axis: q [B, Hkv, G, D] against K/V [B, Hkv, L_max, D]."""
        b = int(span.rows.shape[0])
        qd = q if q.shape[0] == b else q.index_select(0, span.rows)
        qd = qd.view(b, self.hkv, self.group, self.d)
        k, v = self._gather(cache, span.slots)
        k = k.view(b, span.max_len, self.hkv, self.d).transpose(1, 2)
        v = v.view(b, span.max_len, self.hkv, self.d).transpose(1, 2)
        o = F.scaled_dot_product_attention(qd, k, v, attn_mask=span.mask, scale=self.scale)
        return o.reshape(b, self.hq, self.d)
