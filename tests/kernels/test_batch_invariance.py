"""Batch invariance of the default CPU GEMMs on AVX-512 hosts: row r of y must be bitwise
the same whether it is computed alone (M = 1) or inside a batch of any M with any other
rows (continuous batching relies on it: a request's greedy output must not depend on
its batch). Covers the direct (small M) and panel (large M) paths of avx512_w8a16 /
avx512_block_w8a16 and the bf16 lm_head kernel, plus accuracy against the fp32 oracle.

Sensitivity: a bf16 output hides most fp32 accumulation-order differences (~0.1% of
outputs flip), so the invariance checks pass bias = -(the tested row's exact result):
the epilogue's fma then leaves only the fp32 rounding residue of the accumulator, and
any change in summation order changes it (the previous GEMV/brgemm split failed ~40% of
these outputs)."""

from __future__ import annotations

import pytest
import torch

import ext
from engine.kernels.avx512 import GEMV_MAX_M, Avx512BlockW8A16, Avx512W8A16
from engine.kernels.base import Fp8Weight, ScaleKind
from engine.kernels.bf16_linear import Bf16Gemm
from tests.ext.support import assert_close_to_oracle, make_bias, make_weight, needs_avx512

pytestmark = needs_avx512
MS = [2, 3, 5, 16, 33, 64, 130]  # both sides of GEMV_MAX_M and of the 6-row micro-kernel
N, K = 200, 416  # ragged N (7 tiles, last one partial), K = 13 * 32: several K chunks


def _x(m: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(m, k, generator=g) * torch.rand(m, 1, generator=g) * 4).bfloat16()


def _batches(row: torch.Tensor, ms: list[int]):
    """(M, x, r): x [M, K] with `row` at index r and random other rows (seeded by M)."""
    for m in ms:
        x = _x(m, row.shape[1], seed=100 + m)
        for r in {0, m // 2, m - 1}:
            xr = x.clone()
            xr[r] = row[0]
            yield m, xr, r


def _cancelling_bias(row: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """fp32 [N] = -(row [1, K] @ w [N, K].T) in float64: y[row] becomes a rounding residue."""
    return -(row.double() @ w.double().t())[0].float()


def _dequant(w: Fp8Weight) -> torch.Tensor:
    if w.scale_kind is not ScaleKind.BLOCK:
        return w.weight.float() * w.scale.reshape(-1, 1)
    bn, bk = w.block_size
    s = w.scale.repeat_interleave(bn, 0)[: w.n].repeat_interleave(bk, 1)[:, : w.k]
    return w.weight.float() * s


def _assert_invariant(fn, w: torch.Tensor, ms: list[int] = MS) -> None:
    """fn(x [M, K], bias [N]) -> y [M, N]; w [N, K] the dequantized weight."""
    row = _x(1, w.shape[1], seed=7)
    bias = _cancelling_bias(row, w)
    alone = fn(row, bias)
    assert alone.abs().max() < 1e-3 * (row.float() @ w.t()).abs().max()  # a residue
    for m, x, r in _batches(row, ms):
        y = fn(x, bias)
        assert torch.equal(y[r], alone[0]), (
            f"M={m}, row {r}: differs from M=1 by {(y[r].float() - alone[0].float()).abs().max()}")


FP8_CASES = [
    (Avx512W8A16(), ScaleKind.PER_TENSOR, (128, 128)),
    (Avx512W8A16(), ScaleKind.PER_CHANNEL, (128, 128)),
    (Avx512BlockW8A16(), ScaleKind.BLOCK, (128, 128)),
    (Avx512BlockW8A16(), ScaleKind.BLOCK, (32, 256)),  # k-block longer than a K chunk
    (Avx512BlockW8A16(), ScaleKind.BLOCK, (64, 96)),
]


@pytest.mark.parametrize("kernel,kind,block", FP8_CASES,
                         ids=lambda v: getattr(v, "id", getattr(v, "value", str(v))))
@pytest.mark.parametrize("with_bias", [False, True])
def test_fp8_row_is_bitwise_batch_invariant(kernel, kind, block, with_bias):
    w = make_weight(N, K, kind, seed=3, block=block)
    packed, bias = kernel.prepare(w), make_bias(N) if with_bias else None
    _assert_invariant(lambda x, b: kernel.apply(packed, x, b), _dequant(w))
    x = _x(130, K, seed=5)
    assert_close_to_oracle(kernel.apply(packed, x, bias), w, x, bias)


@pytest.mark.parametrize("kind", [ScaleKind.PER_CHANNEL, ScaleKind.BLOCK])
def test_long_k_chunks_and_row_blocks_are_bitwise_invariant(kind):
    # K = 1600 (800 k-pairs): one K chunk below 32 rows is 64 pairs, from 32 rows on 768
    # pairs (two chunks, the second partial); M = 520 crosses the 512-row block
    w = make_weight(96, 1600, kind, seed=8)
    kernel = Avx512W8A16() if kind is ScaleKind.PER_CHANNEL else Avx512BlockW8A16()
    packed = kernel.prepare(w)
    _assert_invariant(lambda x, b: kernel.apply(packed, x, b), _dequant(w), [31, 32, 520])


@pytest.mark.parametrize("kind", [ScaleKind.PER_CHANNEL, ScaleKind.BLOCK])
def test_direct_and_panel_paths_agree_bitwise(kind):
    # the M at which the op switches paths changes speed only, never a bit
    w = make_weight(N, K, kind, seed=4)
    kernel = Avx512W8A16() if kind is ScaleKind.PER_CHANNEL else Avx512BlockW8A16()
    t = kernel.prepare(w).tensors
    bn, bk = (0, 0) if kind is ScaleKind.PER_CHANNEL else w.block_size
    for m in (1, 4, 7, 8, 21, GEMV_MAX_M + 1):  # 8, 21: 8-row groups (+ a remainder)
        x = _x(m, K, seed=m)
        bias = _cancelling_bias(x[:1], _dequant(w))
        ys = [ext.gemm_avx512(x, t["weight"], t["scale"], bias, N, bn, bk, gm)
              for gm in (0, 4, 10_000)]
        assert torch.equal(ys[0], ys[1]) and torch.equal(ys[0], ys[2]), m


def test_fp8_result_does_not_depend_on_thread_count():
    w = make_weight(N, K, ScaleKind.PER_CHANNEL, seed=6)
    kernel = Avx512W8A16()
    packed, x = kernel.prepare(w), _x(70, K, seed=9)
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = kernel.apply(packed, x)
    finally:
        torch.set_num_threads(n)
    assert torch.equal(one, kernel.apply(packed, x))


@pytest.mark.parametrize("out_fp32", [False, True])
@pytest.mark.parametrize("n,k", [(N, K), (1000, 576)])  # 576: the demo model's hidden size
def test_bf16_head_row_is_bitwise_batch_invariant(n, k, out_fp32):
    g = torch.Generator().manual_seed(11)
    w = (torch.randn(n, k, generator=g) * 0.05).bfloat16()
    gemm = Bf16Gemm.prepare(w)
    _assert_invariant(lambda x, b: gemm(x, b, out_fp32=out_fp32), w.float())
    x = _x(64, k, seed=12)
    ref = x.float() @ w.float().t()
    err = (gemm(x, out_fp32=out_fp32).float() - ref).abs()
    assert (err <= 2**-7 * ref.abs() + 2**-7 * ref.pow(2).mean().sqrt()).all()
