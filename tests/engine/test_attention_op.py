"""The C++ paged_attention / kv_write ops (ext/csrc/attention*.cpp).

Against a float64 reference: causal prefill rows and decode rows, GQA, several sequences
with ragged lengths and shuffled (non-contiguous) block tables. Tolerance: q/K/V are the
same bf16 values on both sides; the op accumulates in fp32 (relative error ~1e-6 here)
and rounds the output to bf16 once (<= 2^-9 relative), so |out - ref| <= 2^-8 |ref| + 1e-3
holds with margin, while a wrong slot, mask or head mapping gives errors of order 1.

Batch invariance is exact: the same query row alone, inside a batch of 16 other
sequences, split into prefill chunks, or on another thread count gives identical bits.
"""

from __future__ import annotations

import pytest
import torch

import ext
from tests.engine.kv_layout import blocks_of, slots_of
from tests.ext.support import assert_tests_pass_under_isa

BS = 16  # block size
HQ, HKV, D = 8, 2, 64


@pytest.fixture(scope="module")
def ops():
    st = ext.load()
    assert st.built, st.error
    return torch.ops.fp8serve


def _cache(num_blocks: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K, V caches [num_blocks, HKV, BS, D] bf16 (the ops' layout)."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randn(num_blocks * BS, HKV, D, generator=g).to(torch.bfloat16)
    v = torch.randn(num_blocks * BS, HKV, D, generator=g).to(torch.bfloat16)
    return blocks_of(k, BS), blocks_of(v, BS)


def _tables(lens: list[int], num_blocks: int, seed: int) -> torch.Tensor:
    """[C, W] int32: each sequence gets distinct shuffled blocks."""
    perm = torch.randperm(num_blocks, generator=torch.Generator().manual_seed(seed))
    width = max(-(-n // BS) for n in lens)
    bt = torch.zeros(len(lens), width, dtype=torch.int32)
    used = 0
    for i, n in enumerate(lens):
        need = -(-n // BS)
        bt[i, :need] = perm[used:used + need].to(torch.int32)
        used += need
    return bt


def _reference(q, k_cache, v_cache, bt, token_seq, ctx_lens, bs: int = BS) -> torch.Tensor:
    """float64 softmax(q K^T / sqrt(D)) V per token over its first ctx_len keys (caches in
    the ops' layout, read here slot by slot)."""
    k_cache, v_cache = slots_of(k_cache), slots_of(v_cache)
    out = torch.empty(q.shape[0], HQ * D, dtype=torch.float64)
    for t in range(q.shape[0]):
        n = int(ctx_lens[t])
        pos = torch.arange(n)
        slots = bt[int(token_seq[t])].long()[pos // bs] * bs + pos % bs
        kk = k_cache[slots].double().repeat_interleave(HQ // HKV, dim=1)  # [n, HQ, D]
        vv = v_cache[slots].double().repeat_interleave(HQ // HKV, dim=1)
        s = torch.einsum("hd,nhd->hn", q[t].double(), kk) * D ** -0.5
        out[t] = torch.einsum("hn,nhd->hd", s.softmax(-1), vv).reshape(-1)
    return out


def _assert_close(out: torch.Tensor, ref: torch.Tensor) -> None:
    err = (out.double() - ref).abs()
    bound = 2.0 ** -8 * ref.abs() + 1e-3
    assert bool((err <= bound).all()), f"max excess {(err - bound).max().item():.3g}"


def _q(t: int, seed: int) -> torch.Tensor:
    return torch.randn(t, HQ, D, generator=torch.Generator().manual_seed(seed)).bfloat16()


def _prefill_rows(lens: list[int], starts: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """token_seq, ctx_lens for chunks covering positions [start, len) of each sequence."""
    seq = [i for i, (s, n) in enumerate(zip(starts, lens, strict=True)) for _ in range(s, n)]
    ctx = [p + 1 for s, n in zip(starts, lens, strict=True) for p in range(s, n)]
    return torch.tensor(seq, dtype=torch.int32), torch.tensor(ctx, dtype=torch.int32)


def test_matches_float64_reference_mixed_prefill_and_decode(ops) -> None:
    lens = [1, 17, 40, 16, 33]
    starts = [0, 0, 39, 5, 32]  # prefill chunks with and without context, decode rows
    k, v = _cache(40, seed=1)
    bt = _tables(lens, 40, seed=2)
    seq, ctx = _prefill_rows(lens, starts)
    q = _q(int(seq.shape[0]), seed=3)
    out = ops.paged_attention(q, k, v, bt, seq, ctx, BS, D ** -0.5)
    assert out.shape == (q.shape[0], HQ * D) and out.dtype == torch.bfloat16
    _assert_close(out, _reference(q, k, v, bt, seq, ctx))


def test_strided_q_view_of_a_fused_qk_tensor(ops) -> None:
    """q as the first Hq heads of a [T, Hq + Hkv, D] tensor (what the model passes)."""
    k, v = _cache(8, seed=4)
    bt = _tables([50, 7], 8, seed=5)
    seq, ctx = _prefill_rows([50, 7], [45, 0])
    qk = torch.randn(int(seq.shape[0]), HQ + HKV, D).bfloat16()
    q = qk[:, :HQ]
    out = ops.paged_attention(q, k, v, bt, seq, ctx, BS, D ** -0.5)
    assert torch.equal(out, ops.paged_attention(q.contiguous(), k, v, bt, seq, ctx, BS,
                                                D ** -0.5))
    _assert_close(out, _reference(q, k, v, bt, seq, ctx))


def test_decode_row_alone_equals_inside_a_batch_of_16(ops) -> None:
    lens = [5, 77, 16, 130, 1, 64, 33, 200, 9, 48, 17, 99, 31, 2, 150, 70]
    k, v = _cache(100, seed=6)
    bt = _tables(lens, 100, seed=7)
    n = len(lens)
    seq = torch.arange(n, dtype=torch.int32)
    ctx = torch.tensor(lens, dtype=torch.int32)
    q = _q(n, seed=8)
    batched = ops.paged_attention(q, k, v, bt, seq, ctx, BS, D ** -0.5)
    _assert_close(batched, _reference(q, k, v, bt, seq, ctx))
    for i in (0, 3, 7, 15):  # alone, with its own (narrower) block table
        width = -(-lens[i] // BS)
        alone = ops.paged_attention(q[i:i + 1], k, v, bt[i:i + 1, :width].contiguous(),
                                    torch.zeros(1, dtype=torch.int32), ctx[i:i + 1], BS,
                                    D ** -0.5)
        assert torch.equal(alone[0], batched[i]), i


def test_chunked_prefill_equals_one_shot(ops) -> None:
    n = 90
    k, v = _cache(8, seed=9)
    bt = _tables([n], 8, seed=10)
    q = _q(n, seed=11)
    seq, ctx = _prefill_rows([n], [0])
    whole = ops.paged_attention(q, k, v, bt, seq, ctx, BS, D ** -0.5)
    parts = []
    for a, b in ((0, 7), (7, 40), (40, 89), (89, 90)):
        s, c = _prefill_rows([b], [a])
        parts.append(ops.paged_attention(q[a:b], k, v, bt, s, c, BS, D ** -0.5))
    assert torch.equal(torch.cat(parts), whole)


def test_thread_count_does_not_change_bits(ops) -> None:
    lens = [300, 41, 8]
    k, v = _cache(30, seed=12)
    bt = _tables(lens, 30, seed=13)
    seq, ctx = _prefill_rows(lens, [280, 0, 7])
    q = _q(int(seq.shape[0]), seed=14)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.paged_attention(q, k, v, bt, seq, ctx, BS, D ** -0.5)
        torch.set_num_threads(2)
        two = ops.paged_attention(q, k, v, bt, seq, ctx, BS, D ** -0.5)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_long_single_decode_rows_split_over_threads(ops) -> None:
    """One decode row with a long context runs its 128-key segments on several threads
    and merges them: against the reference, bitwise the same on 1/2/3 threads and inside
    a batch (whole rows per thread), with a block size (7) that cuts the 16-key tiles."""
    bs, lens = 7, [513, 129, 128, 300, 1000, 17]
    blocks = sum(-(-n // bs) for n in lens)
    g = torch.Generator().manual_seed(20)
    k = blocks_of(torch.randn(blocks * bs, HKV, D, generator=g).bfloat16(), bs)
    v = blocks_of(torch.randn(blocks * bs, HKV, D, generator=g).bfloat16(), bs)
    perm = torch.randperm(blocks, generator=g).to(torch.int32)
    width = max(-(-n // bs) for n in lens)
    bt = torch.zeros(len(lens), width, dtype=torch.int32)
    used = 0
    for i, n in enumerate(lens):
        bt[i, :-(-n // bs)] = perm[used:used + -(-n // bs)]
        used += -(-n // bs)
    q = _q(len(lens), seed=21) * 4  # peaked softmax: segments with very different maxima
    seq = torch.arange(len(lens), dtype=torch.int32)
    ctx = torch.tensor(lens, dtype=torch.int32)
    batched = ops.paged_attention(q, k, v, bt, seq, ctx, bs, D ** -0.5)
    _assert_close(batched, _reference(q, k, v, bt, seq, ctx, bs))
    before = torch.get_num_threads()
    try:
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            for i in range(len(lens)):
                alone = ops.paged_attention(q[i:i + 1], k, v, bt[i:i + 1].contiguous(),
                                            torch.zeros(1, dtype=torch.int32),
                                            ctx[i:i + 1], bs, D ** -0.5)
                assert torch.equal(alone[0], batched[i]), (threads, lens[i])
    finally:
        torch.set_num_threads(before)


def test_kv_write_fills_the_named_slots(ops) -> None:
    """Row (slot, h) lands at [slot // BS, h, slot % BS] of a [blocks, HKV, BS, D] cache;
    nothing else changes."""
    k_cache = torch.zeros(4, HKV, BS, D).bfloat16()
    v_cache = torch.zeros(4, HKV, BS, D).bfloat16()
    kv = torch.randn(3, 2 * HKV, D).bfloat16()  # k and v as column slices of one tensor
    slots = torch.tensor([63, 0, 17])
    ops.kv_write(k_cache, v_cache, kv[:, :HKV], kv[:, HKV:], slots)
    for t, slot in enumerate(slots.tolist()):
        for h in range(HKV):
            assert torch.equal(k_cache[slot // BS, h, slot % BS], kv[t, h])
            assert torch.equal(v_cache[slot // BS, h, slot % BS], kv[t, HKV + h])
    assert int(k_cache.abs().sum(dim=-1).ne(0).sum()) == 3 * HKV
    assert torch.equal(slots_of(k_cache)[slots], kv[:, :HKV])
    with pytest.raises(RuntimeError, match="slot 64 outside"):
        ops.kv_write(k_cache, v_cache, kv[:1, :HKV], kv[:1, HKV:], torch.tensor([64]))
    with pytest.raises(RuntimeError, match=r"caches must be bf16 \[blocks, Hkv, block_size, D\]"):
        ops.kv_write(slots_of(k_cache), slots_of(v_cache), kv[:1, :HKV], kv[:1, HKV:],
                     slots[:1])


def test_torch_reference_rows_match_the_op_layout(ops) -> None:
    """kv_store's torch twins (LayerKV.scatter / gather, kv_rows) put and find each
    (slot, head) row where kv_write does, for a block size that is not a power of two."""
    from engine.model.kv_store import LayerKV

    bs, blocks = 5, 6
    kv = torch.randn(7, 2 * HKV, D).bfloat16()
    slots = torch.tensor([29, 0, 4, 5, 17, 12, 24])
    op = LayerKV(*(torch.zeros(blocks, HKV, bs, D).bfloat16() for _ in range(2)))
    ref = LayerKV(*(torch.zeros(blocks, HKV, bs, D).bfloat16() for _ in range(2)))
    ops.kv_write(op.k, op.v, kv[:, :HKV], kv[:, HKV:], slots)
    ref.scatter(slots, kv[:, :HKV], kv[:, HKV:])
    assert torch.equal(op.k, ref.k) and torch.equal(op.v, ref.v)
    k, v = op.gather(slots)
    assert torch.equal(k, kv[:, :HKV]) and torch.equal(v, kv[:, HKV:])
    assert torch.equal(slots_of(op.k)[slots], kv[:, :HKV])


def test_bad_indices_and_shapes_are_rejected(ops) -> None:
    k, v = _cache(2, seed=15)
    q = _q(1, seed=16)
    one = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="block id 2 outside"):
        ops.paged_attention(q, k, v, torch.tensor([[2]], dtype=torch.int32), one,
                            torch.ones(1, dtype=torch.int32), BS, 1.0)
    with pytest.raises(RuntimeError, match="ctx_lens"):
        ops.paged_attention(q, k, v, torch.tensor([[1]], dtype=torch.int32), one,
                            torch.tensor([BS + 1], dtype=torch.int32), BS, 1.0)
    with pytest.raises(RuntimeError, match="block_tables must be a contiguous 2-D int32"):
        ops.paged_attention(q, k, v, torch.tensor([[1]]), one, one + 1, BS, 1.0)
    bt = torch.tensor([[1]], dtype=torch.int32)
    with pytest.raises(RuntimeError, match=r"k_cache must be \[blocks, Hkv, block_size, D\]"):
        ops.paged_attention(q, slots_of(k), slots_of(v), bt, one, one + 1, BS, 1.0)
    with pytest.raises(RuntimeError, match=r"k_cache must be a contiguous cache \[blocks=2, "
                                           r"Hkv=2, block_size=8, D=64\]"):
        ops.paged_attention(q, k, v, bt, one, one + 1, BS // 2, 1.0)  # block_size != dim 2
    with pytest.raises(RuntimeError, match="must be a contiguous cache"):
        ops.paged_attention(q, k.transpose(1, 2).contiguous().transpose(1, 2), v, bt, one,
                            one + 1, BS, 1.0)


def test_portable_kernel_below_avx512(ops) -> None:
    """FP8SERVE_ISA=scalar runs the portable C++ kernel (same checks, own process)."""
    assert_tests_pass_under_isa(
        "scalar", "tests.engine.test_attention_op",
        "test_matches_float64_reference_mixed_prefill_and_decode",
        "test_decode_row_alone_equals_inside_a_batch_of_16",
        "test_long_single_decode_rows_split_over_threads")
