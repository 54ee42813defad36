"""The FP8 KV cache ops: kv_write_fp8 and paged_attention on float8_e4m3fn K/V
(ext/csrc/kv_fp8.cpp; the AVX-512 or AVX2 attention kernel as the host has, the portable
one of attention.cpp below AVX2 or under FP8SERVE_ISA=scalar in its own process).

* The write gives the same bytes and scales as the torch reference quantizer
  (engine/model/kv_store.py quantize_kv), per (token, KV head), dynamic or static.
* Attention over fp8 K/V matches a float64 reference over the *dequantized* K/V with the
  bf16 test's tolerance (2^-8 |ref| + 1e-3: the op's inputs are exactly those values; it
  accumulates in fp32 and rounds to bf16 once).
* Against bf16 K/V the error is e4m3's: a value keeps 3 mantissa bits, <= 2^-4 relative
  (round to nearest), RMS 2^-4 / sqrt(3) = 3.6% for uniformly spread mantissas; the
  attention output inherits about that (relative L2 0.040 measured with peaked scores,
  K ~ 3 N(0, 1)), so the test bounds it by 0.08, 2x; a wrong scale or row gives O(1).
* Batch and chunk invariance are exact, as for bf16.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import ext
from engine.model.kv_store import dequantize_kv, quantize_kv
from tests.engine.kv_layout import blocks_of, slots_of
from tests.engine.test_attention_op import (
    BS,
    HKV,
    HQ,
    D,
    _assert_close,
    _prefill_rows,
    _q,
    _reference,
    _tables,
)
from tests.ext.support import assert_tests_pass_under_isa


@pytest.fixture(scope="module")
def ops():
    st = ext.load()
    assert st.built, st.error
    return torch.ops.fp8serve


def _bf16_kv(rows: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    k = (torch.randn(rows, HKV, D, generator=g) * 3).bfloat16()
    v = torch.randn(rows, HKV, D, generator=g).bfloat16()
    return k, v


def _fp8_cache(ops, k: torch.Tensor, v: torch.Tensor, static=(0.0, 0.0)):
    """All rows of bf16 k, v [S, Hkv, D] written to slots 0 .. S - 1 -> (k8, v8, ks, vs)
    in the ops' layout: [blocks, Hkv, BS, D] e4m3 and [blocks, Hkv, BS] fp32."""
    s = k.shape[0]
    blocks = -(-s // BS)
    k8 = torch.zeros(blocks, HKV, BS, D, dtype=torch.float8_e4m3fn)
    v8 = torch.zeros_like(k8)
    ks, vs = torch.ones(blocks, HKV, BS), torch.ones(blocks, HKV, BS)
    ops.kv_write_fp8(k8, v8, ks, vs, k, v, torch.arange(s), *static)
    return k8, v8, ks, vs


def _rows(c: torch.Tensor, n: int) -> torch.Tensor:
    """The first n slots of a cache (or its scales), slot-major: [n, Hkv(, D)]."""
    return slots_of(c.view(torch.uint8) if c.dtype == torch.float8_e4m3fn else c)[:n]


def test_write_matches_the_reference_quantizer(ops) -> None:
    k, v = _bf16_kv(40, seed=1)
    k[3, 1] = 0  # an all-zero row: scale 1, zeros stored
    k8, v8, ks, vs = _fp8_cache(ops, k, v)
    for x, q, s in ((k, k8, ks), (v, v8, vs)):
        rq, rs = quantize_kv(x)
        assert torch.equal(_rows(q, 40), rq.view(torch.uint8)) and torch.equal(_rows(s, 40), rs)
    k8r, ksr = _rows(k8, 40).view(torch.float8_e4m3fn), _rows(ks, 40)
    assert ksr[3, 1] == 1.0 and not k8r[3, 1].view(torch.uint8).any()
    assert float(k8r.float().abs().amax()) == 448.0  # each row's amax lands on e4m3's max
    rel = (dequantize_kv(k8r, ksr) - k.float()).abs() / k.float().abs().clamp_min(1e-3)
    assert float(rel[k.float().abs() > ksr[..., None] * 2 ** -6].max()) <= 2 ** -4


def test_static_scale_is_stored_and_clamps(ops) -> None:
    k, v = _bf16_kv(8, seed=2)
    k8, v8, ks, vs = _fp8_cache(ops, k, v, static=(0.01, 0.5))
    assert bool((_rows(ks, 8) == 0.01).all()) and bool((_rows(vs, 8) == 0.5).all())
    assert float(k8.float().abs().amax()) == 448.0  # |k| / 0.01 overflows: clamped
    rq, _ = quantize_kv(v, 0.5)
    assert torch.equal(_rows(v8, 8), rq.view(torch.uint8))


def test_write_only_touches_named_slots_and_checks_bounds(ops) -> None:
    k8 = torch.zeros(4, HKV, BS, D, dtype=torch.float8_e4m3fn)
    v8, ks, vs = torch.zeros_like(k8), torch.ones(4, HKV, BS), torch.ones(4, HKV, BS)
    kv = torch.randn(3, 2 * HKV, D).bfloat16()  # k and v as column slices of one tensor
    slots = torch.tensor([63, 0, 17])
    ops.kv_write_fp8(k8, v8, ks, vs, kv[:, :HKV], kv[:, HKV:], slots)
    assert int(_rows(k8, 4 * BS).ne(0).any(dim=(1, 2)).sum()) == 3
    rq, rs = quantize_kv(kv[:, HKV:].contiguous())
    assert torch.equal(_rows(v8, 4 * BS)[slots], rq.view(torch.uint8))
    assert torch.equal(_rows(vs, 4 * BS)[slots], rs)
    assert torch.equal(vs[63 // BS, :, 63 % BS], rs[0])  # (slot, h) at [slot // BS, h, slot % BS]
    with pytest.raises(RuntimeError, match="slot 64 outside"):
        ops.kv_write_fp8(k8, v8, ks, vs, kv[:1, :HKV], kv[:1, HKV:], torch.tensor([64]))
    with pytest.raises(RuntimeError, match=r"scales must be contiguous fp32 \[blocks=4, Hkv=2, "
                                           r"block_size=16\]"):
        ops.kv_write_fp8(k8, v8, ks[:, :1], vs, kv[:1, :HKV], kv[:1, HKV:], slots[:1])


def test_attention_matches_reference_on_dequantized_kv(ops) -> None:
    lens, starts = [1, 17, 40, 16, 33], [0, 0, 39, 5, 32]
    k, v = _bf16_kv(40 * BS, seed=3)
    k8, v8, ks, vs = _fp8_cache(ops, k, v)
    bt = _tables(lens, 40, seed=4)
    seq, ctx = _prefill_rows(lens, starts)
    q = _q(int(seq.shape[0]), seed=5)
    out = ops.paged_attention(q, k8, v8, bt, seq, ctx, BS, D ** -0.5, ks, vs)
    assert out.shape == (q.shape[0], HQ * D) and out.dtype == torch.bfloat16
    kd, vd = dequantize_kv(k8, ks), dequantize_kv(v8, vs)
    _assert_close(out, _reference(q, kd, vd, bt, seq, ctx))
    ref16 = _reference(q, blocks_of(k, BS), blocks_of(v, BS), bt, seq, ctx)  # the bf16 K/V
    rel = float((out.double() - ref16).norm() / ref16.norm())
    assert rel < 0.08, rel  # measured 0.040 (bf16 K/V: 0.0015)


def test_decode_alone_equals_batched_and_chunked_equals_one_shot(ops) -> None:
    lens = [5, 77, 16, 130, 1, 64, 33, 200]
    k, v = _bf16_kv(60 * BS, seed=6)
    k8, v8, ks, vs = _fp8_cache(ops, k, v)
    bt = _tables(lens, 60, seed=7)
    n = len(lens)
    seq, ctx = torch.arange(n, dtype=torch.int32), torch.tensor(lens, dtype=torch.int32)
    q = _q(n, seed=8)
    batched = ops.paged_attention(q, k8, v8, bt, seq, ctx, BS, D ** -0.5, ks, vs)
    for i in (0, 3, 7):
        width = -(-lens[i] // BS)
        alone = ops.paged_attention(q[i:i + 1], k8, v8, bt[i:i + 1, :width].contiguous(),
                                    torch.zeros(1, dtype=torch.int32), ctx[i:i + 1], BS,
                                    D ** -0.5, ks, vs)
        assert torch.equal(alone[0], batched[i]), i
    qp = _q(200, seed=9)
    s_all, c_all = _prefill_rows([200], [0])
    whole = ops.paged_attention(qp, k8, v8, bt[7:8].contiguous(), s_all, c_all, BS,
                                D ** -0.5, ks, vs)
    parts = [ops.paged_attention(qp[a:b], k8, v8, bt[7:8].contiguous(),
                                 *_prefill_rows([b], [a]), BS, D ** -0.5, ks, vs)
             for a, b in ((0, 7), (7, 130), (130, 200))]
    assert torch.equal(torch.cat(parts), whole)


def test_chunked_writes_store_the_same_bytes(ops) -> None:
    k, v = _bf16_kv(50, seed=10)
    whole = _fp8_cache(ops, k, v)
    parts = [torch.zeros_like(whole[0]), torch.zeros_like(whole[1]),
             torch.ones_like(whole[2]), torch.ones_like(whole[3])]
    for a, b in ((0, 3), (3, 31), (31, 50)):
        ops.kv_write_fp8(*parts, k[a:b], v[a:b], torch.arange(a, b))
    for x, y in zip(whole, parts, strict=True):
        assert torch.equal(x.view(torch.uint8), y.view(torch.uint8))


def test_scales_must_come_with_fp8_caches(ops) -> None:
    k, v = _bf16_kv(BS, seed=11)
    k8, v8, ks, vs = _fp8_cache(ops, k, v)
    q, one = _q(1, seed=12), torch.zeros(1, dtype=torch.int32)
    bt = torch.zeros(1, 1, dtype=torch.int32)
    with pytest.raises(RuntimeError, match="exactly for fp8 caches"):
        ops.paged_attention(q, k8, v8, bt, one, one + 1, BS, 1.0)
    with pytest.raises(RuntimeError, match="exactly for fp8 caches"):
        ops.paged_attention(q, blocks_of(k, BS), blocks_of(v, BS), bt, one, one + 1, BS, 1.0,
                            ks, vs)
    with pytest.raises(RuntimeError, match=r"scales must be contiguous fp32 \[blocks=1, Hkv=2, "
                                           r"block_size=16\]"):
        ops.paged_attention(q, k8, v8, bt, one, one + 1, BS, 1.0, ks.double(), vs)
    with pytest.raises(RuntimeError, match="must both be bf16 or both float8_e4m3fn"):
        ops.paged_attention(q, k8, blocks_of(v, BS), bt, one, one + 1, BS, 1.0, ks, vs)


def test_fake_impls_give_shapes_and_check_scales(ops) -> None:
    with FakeTensorMode():
        k8 = torch.empty(1, HKV, BS, D, dtype=torch.float8_e4m3fn)
        ks = torch.empty(1, HKV, BS)
        q, i1 = torch.empty(3, HQ, D, dtype=torch.bfloat16), torch.empty(3, dtype=torch.int32)
        out = ops.paged_attention(q, k8, k8, torch.empty(1, 1, dtype=torch.int32), i1, i1,
                                  BS, 1.0, ks, ks)
        assert out.shape == (3, HQ * D)
        kv = torch.empty(3, HKV, D, dtype=torch.bfloat16)
        ops.kv_write_fp8(k8, k8, ks, ks, kv, kv, torch.empty(3, dtype=torch.int64))
        with pytest.raises(Exception, match=r"scales must be fp32 \[blocks, Hkv, block_size\]"):
            ops.kv_write_fp8(k8, k8, ks[:, :1], ks, kv, kv, torch.empty(3, dtype=torch.int64))
        kb = torch.empty(1, HKV, BS, D, dtype=torch.bfloat16)
        ops.kv_write(kb, kb, kv, kv, torch.empty(3, dtype=torch.int64))
        with pytest.raises(Exception, match=r"k/v must be \[T, Hkv, D\] = \[T, 2, 64\]"):
            ops.kv_write(kb, kb, kv[:, :1], kv, torch.empty(3, dtype=torch.int64))
        with pytest.raises(Exception, match="k_cache / v_cache must be"):
            ops.paged_attention(q, k8, k8[:, :1], torch.empty(1, 1, dtype=torch.int32), i1, i1,
                                BS, 1.0, ks, ks)
        h = torch.empty(3, 32, dtype=torch.bfloat16)
        stack = torch.empty(2, 2, 1, HKV, BS, D, dtype=torch.float8_e4m3fn)
        scales = torch.empty(2, 2, 1, HKV, BS)
        assert ops.decode_stack(h, [], [], 1e-5, [], i1, stack, i1, [], scales,
                                [0.0] * 4).shape == h.shape
        with pytest.raises(Exception, match=r"kv_scales must be \[L, 2, blocks, Hkv, block_size\]"):
            ops.decode_stack(h, [], [], 1e-5, [], i1, stack, i1, [], scales[:, :, :, :1])
        assert ops.decode_layer(h, [], [], 1e-5, [], i1, k8, k8, i1, [], ks, ks).shape == h.shape


def test_every_e4m3_code_is_read_exactly(ops) -> None:
    """One key (softmax weight exactly 1): the output is that V row, so each of the 254
    non-NaN codes must come back as its exact value (e4m3 values are exact in bf16)."""
    codes = torch.arange(256, dtype=torch.int32)
    codes[(codes & 0x7F) == 0x7F] = 0  # the NaN codes: writes clamp, never store them
    v8 = codes.to(torch.uint8).view(256 // D, 1, 1, D).repeat(1, HKV, 1, 1)
    v8 = v8.view(torch.float8_e4m3fn)  # [rows, HKV, block_size 1, D]
    rows = v8.shape[0]
    k8 = torch.zeros_like(v8)
    ones = torch.ones(rows, HKV, 1)
    seq, ctx = torch.zeros(1, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    for r in range(rows):
        bt = torch.tensor([[r]], dtype=torch.int32)
        out = ops.paged_attention(_q(1, seed=r), k8, v8, bt, seq, ctx, 1, D ** -0.5, ones, ones)
        want = v8[r].float().repeat_interleave(HQ // HKV, dim=0).reshape(-1)
        assert torch.equal(out[0].float(), want), r


def test_every_e4m3_code_of_k_is_read_exactly(ops) -> None:
    """Two keys, q one-hot on element 0: key 0 holds code c there (zeros elsewhere), key 1
    is zero, V 1 for key 0 and 0 for key 1, so the output is sigmoid(e4m3(c) * ks0). With
    ks0 = 0.5 / |e4m3(c)| every code must give sigmoid(+-0.5) (or 0.5 for the zeros); a
    value one e4m3 step off moves it by 0.008 or more, twice bf16's step there."""
    q = torch.zeros(1, HQ, D).bfloat16()
    q[..., 0] = 1
    seq, ctx = torch.zeros(1, dtype=torch.int32), torch.full((1,), 2, dtype=torch.int32)
    bt = torch.tensor([[0, 1]], dtype=torch.int32)
    v8 = torch.zeros(2, HKV, 1, D).to(torch.float8_e4m3fn)
    v8[0] = 1.0
    vs = torch.ones(2, HKV, 1)
    for c in range(256):
        if c & 0x7F == 0x7F:
            continue  # the NaN codes: writes clamp, never store them
        k8 = torch.zeros(2, HKV, 1, D, dtype=torch.uint8)
        k8[0, :, 0, 0] = c
        k8 = k8.view(torch.float8_e4m3fn)
        value = k8[0, 0, 0, 0].float().item()
        ks = torch.ones(2, HKV, 1)
        ks[0] = 0.5 / abs(value) if value else 1.0
        out = ops.paged_attention(q, k8, v8, bt, seq, ctx, 1, 1.0, ks, vs)
        want = 1 / (1 + math.exp(-math.copysign(0.5, value))) if value else 0.5
        assert (out.float() - want).abs().max().item() <= 3e-3, (c, value, out[0, 0].item())


def test_portable_kernel_reads_fp8_too(ops) -> None:
    """FP8SERVE_ISA=scalar: the same checks on the portable kernel (own process)."""
    assert_tests_pass_under_isa(
        "scalar", "tests.engine.test_attention_fp8",
        "test_attention_matches_reference_on_dequantized_kv",
        "test_decode_alone_equals_batched_and_chunked_equals_one_shot",
        "test_every_e4m3_code_is_read_exactly", "test_every_e4m3_code_of_k_is_read_exactly")
