"""The AVX2 bf16-weight GEMM (pack_bf16_avx2 + gemm_bf16_avx2, engine/kernels/bf16_linear.py):
the fp32 oracle, bitwise batch invariance across both schedules of csrc/avx2_gemm.inc
(direct for M <= 3, shared fp32 panels above, in blocks of 48 rows), its layout contracts,
and Bf16Linear's kernel choice (bf16_avx512, then bf16_avx2, then bf16_portable)."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import ext
from engine.kernels.base import LayoutError
from engine.kernels.bf16_linear import (
    AVX2_KERNEL_ID,
    BF16_AVX2_LAYOUT,
    PORTABLE_KERNEL_ID,
    Bf16Gemm,
    bf16_avx2_reason,
    bf16_gemm_reason,
    choose_bf16_kernel,
)
from engine.model.layers import Bf16Linear
from tests.ext.support import (
    AVX2_HOST,
    AVX512_HOST,
    assert_tests_pass_under_isa,
    fake_hw,
    make_bias,
    needs_avx2,
)
from tests.kernels.test_batch_invariance import _assert_invariant, _x
from tests.kernels.test_bf16_gemm import _assert_close, _w

pytestmark = needs_avx2
# k 417: several 128-deep panel chunks and an odd tail; M crosses 3 (direct -> panel) and
# 48 (a second row block)
MS = [2, 3, 4, 5, 6, 7, 16, 48, 49, 130]


def test_pack_order_matches_pack_avx2():
    w = _w(40, 70)
    packed = ext.pack_bf16_avx2(w)
    assert tuple(packed.shape) == (3, 70, 16) and packed.dtype == torch.bfloat16
    t, c, j = 1, 17, 5  # element [t, c, j] = w[16t + j, c]
    assert packed[t, c, j] == w[16 * t + j, c]
    assert packed[2, :, 8:].abs().sum() == 0  # rows 40..47 are padding


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("out_fp32", [False, True])
@pytest.mark.parametrize("m,n,k", [(1, 16, 64), (3, 48, 200), (7, 100, 41), (130, 300, 576)])
def test_matches_oracle(m, n, k, out_fp32, with_bias):
    w, x = _w(n, k), _x(m, k, seed=1)
    bias = make_bias(n) if with_bias else None
    y = Bf16Gemm.prepare(w, AVX2_KERNEL_ID)(x, bias, out_fp32=out_fp32)
    assert y.dtype == (torch.float32 if out_fp32 else torch.bfloat16)
    _assert_close(y, x.float() @ w.float().t() + (bias if bias is not None else 0))


@pytest.mark.parametrize("out_fp32", [False, True])
@pytest.mark.parametrize("n,k", [(200, 417), (1000, 576)])  # 576: the demo model's hidden
def test_row_is_bitwise_batch_invariant(n, k, out_fp32):
    w = _w(n, k, seed=11)
    gemm = Bf16Gemm.prepare(w, AVX2_KERNEL_ID)
    _assert_invariant(lambda x, b: gemm(x, b, out_fp32=out_fp32), w.float(), MS)


def test_thread_count_does_not_change_bits():
    w, x = _w(300, 576, seed=3), _x(20, 576, seed=4)
    gemm = Bf16Gemm.prepare(w, AVX2_KERNEL_ID)
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = gemm(x, out_fp32=True)
    finally:
        torch.set_num_threads(n)
    assert torch.equal(one, gemm(x, out_fp32=True))


def test_fp32_output_is_the_unrounded_bf16_output():
    w, x = _w(64, 96), _x(5, 96, seed=2)
    g = Bf16Gemm.prepare(w, AVX2_KERNEL_ID)
    assert torch.equal(g(x, out_fp32=True).bfloat16(), g(x))


def test_zero_rows():
    g = Bf16Gemm.prepare(_w(48, 32), AVX2_KERNEL_ID)
    assert tuple(g(_x(0, 32, seed=1)).shape) == (0, 48)


def test_layout_contracts():
    w = _w(64, 64)
    with pytest.raises(LayoutError, match="row-major"):
        Bf16Gemm.prepare(w.t(), AVX2_KERNEL_ID)  # a transposed view is never reinterpreted
    with pytest.raises(LayoutError, match="bf16"):
        Bf16Gemm.prepare(w.float(), AVX2_KERNEL_ID)
    with pytest.raises(ValueError, match="unknown bf16 kernel"):
        Bf16Gemm.prepare(w, "bf16_nope")
    g = Bf16Gemm.prepare(w, AVX2_KERNEL_ID)
    assert g.packed.layout == BF16_AVX2_LAYOUT and g.kernel_id == AVX2_KERNEL_ID
    with pytest.raises(LayoutError, match="K=64"):
        g(_x(1, 60, seed=1))
    with pytest.raises(RuntimeError, match="N/16, K, 16"):
        ext.gemm_bf16_avx2(_x(1, 64, seed=1), g.packed.tensors["weight"], None, 96)
    with pytest.raises(RuntimeError, match="bias must be contiguous float32"):
        ext.gemm_bf16_avx2(_x(1, 64, seed=1), g.packed.tensors["weight"],
                           torch.zeros(63), 64)


def test_fake_impl_shapes():
    with FakeTensorMode():
        x = torch.empty(3, 70, dtype=torch.bfloat16)
        wp = torch.empty(3, 70, 16, dtype=torch.bfloat16)
        assert torch.ops.fp8serve.gemm_bf16_avx2(x, wp, None, 40, True).shape == (3, 40)
        packed = torch.ops.fp8serve.pack_bf16_avx2(torch.empty(40, 70, dtype=torch.bfloat16))
        assert tuple(packed.shape) == (3, 70, 16)


def test_kernel_choice_by_priority():
    assert choose_bf16_kernel(fake_hw(*AVX2_HOST)) == (AVX2_KERNEL_ID, None)
    # no FMA/F16C: neither ISA kernel, so the portable one
    assert choose_bf16_kernel(fake_hw("avx2")) == (PORTABLE_KERNEL_ID, None)
    assert "fma" in (bf16_avx2_reason(fake_hw("avx2")) or "")


def test_bf16_linear_routes_to_the_avx2_kernel():
    w, x = _w(100, 64), _x(4, 64, seed=1)
    head = Bf16Linear("lm_head", w, fake_hw(*AVX2_HOST))
    assert head.kernel_id == AVX2_KERNEL_ID and head.reason is None
    assert torch.equal(head(x), Bf16Gemm.prepare(w, AVX2_KERNEL_ID)(x))
    assert torch.equal(head.fp32(x), Bf16Gemm.prepare(w, AVX2_KERNEL_ID)(x, out_fp32=True))
    assert head.weight.data_ptr() == w.data_ptr()  # a tied embedding is not copied
    plain = Bf16Linear("lm_head", w, fake_hw("avx2"))
    assert plain.kernel_id == PORTABLE_KERNEL_ID
    assert torch.equal(plain(x), Bf16Gemm.prepare(w, PORTABLE_KERNEL_ID)(x))


def check_capped_dispatch_routes_to_portable(ops) -> None:
    """FP8SERVE_ISA=scalar: the ISA bf16 kernels would refuse to run, so a profile that
    does not carry the dispatch level (a hand-built one) gets bf16_portable, and says why
    the others were passed over."""
    assert choose_bf16_kernel(fake_hw(*AVX512_HOST, *AVX2_HOST)) == (PORTABLE_KERNEL_ID, None)
    assert "below avx512" in bf16_gemm_reason(fake_hw(*AVX512_HOST, *AVX2_HOST))
    assert "below avx2" in bf16_avx2_reason(fake_hw(*AVX512_HOST, *AVX2_HOST))


def test_a_capped_dispatch_routes_to_portable():
    assert_tests_pass_under_isa("scalar", __name__, "check_capped_dispatch_routes_to_portable")
