"""Batch invariance of avx2_w8a16 and avx2_block_w8a16 (hosts without AVX-512): row r of
y is bitwise the same alone (M = 1) or inside any batch, whatever its position in the
kernel's row groups
(the same cancelling-bias sensitivity as tests/kernels/test_batch_invariance.py)."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import ext
from engine.kernels.avx2 import Avx2BlockW8A16, Avx2W8A16
from engine.kernels.base import Fp8Weight, ScaleKind
from tests.ext.support import assert_close_to_oracle, make_bias, make_weight, needs_avx2
from tests.ext.support import make_x as make_x_bf16
from tests.kernels.test_batch_invariance import _assert_invariant, _dequant, _x

pytestmark = needs_avx2
N, K = 200, 417  # ragged N (13 tiles of 16, the last partial), odd K: the k tail runs


@pytest.mark.parametrize("kind", [ScaleKind.PER_TENSOR, ScaleKind.PER_CHANNEL])
def test_avx2_row_is_bitwise_batch_invariant(kind):
    kernel = Avx2W8A16()
    w = make_weight(N, K, kind, seed=3)
    packed = kernel.prepare(w)
    _assert_invariant(lambda x, b: kernel.apply(packed, x, b), _dequant(w),
                      [2, 3, 4, 5, 6, 7, 16, 33, 130])
    x = _x(37, K, seed=5)
    bias = make_bias(N)
    assert_close_to_oracle(kernel.apply(packed, x, bias), w, x, bias)


@pytest.mark.parametrize("block", [(128, 128), (32, 64), (64, 32)])
def test_avx2_block_row_is_bitwise_batch_invariant(block):
    """Block scales (ragged N and K: partial last column and k blocks): every row alone or
    in any batch, the panel path (M > 3) and the row chunks of the scaled x included, and
    close to the dequantized reference."""
    kernel = Avx2BlockW8A16()
    w = make_weight(N, K, ScaleKind.BLOCK, seed=6, block=block)
    packed = kernel.prepare(w)
    assert packed.tensors["scale"].shape == w.scale.shape
    _assert_invariant(lambda x, b: kernel.apply(packed, x, b), _dequant(w),
                      [2, 3, 4, 5, 6, 7, 16, 33, 130])
    x = _x(37, K, seed=7)
    bias = make_bias(N)
    assert_close_to_oracle(kernel.apply(packed, x, bias), w, x, bias)


def test_avx2_block_scales_each_k_block_by_its_own_scale():
    """One-hot rows read single weights: y[r, n] = w[n, r] * s[n // bn, r // bk] exactly
    (an e4m3 value times a power-of-two scale), so a scale applied to the wrong block, or
    not at all, shows."""
    n, k, bn, bk = 64, 96, 32, 32
    w = _all_codes_weight(n, k)
    s = torch.tensor([[2.0**e for e in range(j, j + 3)] for j in (-3, 1)])  # [2, 3]
    wb = Fp8Weight(w.weight, s, ScaleKind.BLOCK, block_size=(bn, bk))
    kernel = Avx2BlockW8A16()
    y = kernel.apply(kernel.prepare(wb), torch.eye(k, dtype=torch.bfloat16), None)
    full = s.repeat_interleave(bn, 0).repeat_interleave(bk, 1)
    assert torch.equal(y.float(), (w.weight.float() * full).t().to(torch.bfloat16).float())


def _all_codes_weight(n: int, k: int):
    """[n, k] e4m3 whose codes run through all 254 non-NaN values (row-major), scale 1."""
    codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
    flat = codes.repeat(-(-n * k // codes.numel()))[: n * k]
    return Fp8Weight(flat.view(n, k).view(torch.float8_e4m3fn), torch.ones(()),
                     ScaleKind.PER_TENSOR)


@pytest.mark.parametrize("magnitude", [1.0, 2.0**16])
def test_every_code_widens_exactly_on_both_routes(magnitude):
    """Activations with |x| < 2^16 take the prescaled route (codes widened to value * 2^-120,
    denormal for exponent-0 codes); any larger entry sends the call down the fp16 route.
    One-hot rows read single weights: y must equal code value * magnitude exactly (as
    values: the code -0 sums to +0)."""
    n, k = 48, 16
    w = _all_codes_weight(n, k)
    kernel = Avx2W8A16()
    packed = kernel.prepare(w)
    x = torch.eye(k, dtype=torch.bfloat16) * magnitude
    y = kernel.apply(packed, x, None)
    expect = (w.weight.float().t() * magnitude).to(torch.bfloat16)
    assert torch.equal(y.float(), expect.float())


def test_rows_are_the_same_whichever_route_the_batch_takes():
    """A row with an entry >= 2^16 moves the whole call to the fp16 route; the other rows
    must keep the bits they get alone (on the prescaled route)."""
    kernel = Avx2W8A16()
    w = make_weight(N, K, ScaleKind.PER_CHANNEL, seed=4)
    packed = kernel.prepare(w)
    x = _x(5, K, seed=9)
    big = x.clone()
    big[2, 7] = 70000.0
    batched = kernel.apply(packed, big, None)  # M = 5: the panel schedule
    for r in (0, 1, 3, 4):
        alone = kernel.apply(packed, x[r : r + 1], None)
        assert torch.equal(batched[r].view(torch.int16), alone[0].view(torch.int16)), r
    pair = kernel.apply(packed, big[1:3], None)  # M = 2: the direct schedule
    alone = kernel.apply(packed, x[1:2], None)
    assert torch.equal(pair[0].view(torch.int16), alone[0].view(torch.int16))
    assert torch.isfinite(batched[2].float()).all()


def test_row_blocks_outermost_keep_the_bits():
    """Above 4 MiB of fp32 activations (M * K * 4) each block of rows runs over every tile
    (avx2_gemm.inc kRowOuterXBytes) instead of every tile over all rows; a row's bits stay
    those it gets alone."""
    k = 8200  # 130 rows: 4.26 MB
    kernel = Avx2W8A16()
    w = make_weight(40, k, ScaleKind.PER_CHANNEL, seed=6)
    packed = kernel.prepare(w)
    _assert_invariant(lambda x, b: kernel.apply(packed, x, b), _dequant(w), [130])


@pytest.mark.parametrize("block", [(0, 0), (32, 32)], ids=["per-channel", "block"])
def test_empty_k_gives_the_bias(block):
    """K = 0 (an empty reduction) gives y = bias with or without block scales, as the
    portable op does; block scales used to divide by K sizing their row chunks (SIGFPE)."""
    bn, bk = block
    wp = ext.pack_avx2(torch.zeros(48, 0).to(torch.float8_e4m3fn))
    x, bias = torch.zeros(3, 0, dtype=torch.bfloat16), make_bias(48)
    scale = torch.ones(2, 0) if bk else torch.ones(48)
    want = bias.bfloat16().expand(3, 48)
    assert torch.equal(ext.gemm_avx2(x, wp, scale, bias, 48, bn, bk), want)
    assert torch.equal(ext.gemm_portable(x, wp, scale, bias, 48, bn, bk), want)


def test_avx2_block_bad_shapes_name_the_expected_shape():
    """The op (and its fake) reject a block scale of the wrong shape or block size, naming it."""
    w = make_weight(48, 200, ScaleKind.BLOCK, block=(32, 64))
    wp, x = ext.pack_avx2(w.weight), make_x_bf16(3, 200)
    with pytest.raises(RuntimeError, match=r"block scale must be \[ceil\(N/bn\), ceil\(K/bk\)\] "
                                           r"= \[2, 4\]"):
        ext.gemm_avx2(x, wp, torch.ones(2, 3), None, 48, 32, 64)
    with pytest.raises(RuntimeError, match=r"block size \(48, 64\) must be multiples of"):
        ext.gemm_avx2(x, wp, w.scale, None, 48, 48, 64)
    assert tuple(ext.gemm_avx2(x, wp, w.scale, None, 48, 32, 64).shape) == (3, 48)
    with FakeTensorMode():
        fx = torch.empty(3, 200, dtype=torch.bfloat16)
        fw = torch.empty(3, 200, 16, dtype=torch.float8_e4m3fn)
        y = torch.ops.fp8serve.gemm_avx2(fx, fw, torch.empty(2, 4), None, 48, 32, 64)
        assert tuple(y.shape) == (3, 48)
        with pytest.raises(Exception, match=r"scale must be float32 \(2, 4\)"):
            torch.ops.fp8serve.gemm_avx2(fx, fw, torch.empty(2, 3), None, 48, 32, 64)
