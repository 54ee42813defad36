"""The bf16-weight GEMM (pack_bf16_vnni32 + gemm_bf16_avx512, engine/kernels/bf16_linear.py)
against the fp32 oracle, its layout contracts, and Bf16Linear's routing (C++ kernel when
the host can run it, the portable one below, torch.mm without the extension)."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import ext
from engine.hardware import ExtensionStatus, HardwareInfo
from engine.kernels.base import LayoutError
from engine.kernels.bf16_linear import (
    BF16_VNNI32_LAYOUT,
    KERNEL_ID,
    PORTABLE_KERNEL_ID,
    Bf16Gemm,
    bf16_gemm_reason,
)
from engine.model.layers import Bf16Linear
from tests.ext.support import AVX2_HOST, AVX512_HOST, fake_hw, make_bias, needs_avx512

pytestmark = needs_avx512
TOL = 2.0**-7


def _w(n: int, k: int, seed: int = 0) -> torch.Tensor:
    return (torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05).bfloat16()


def _x(m: int, k: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(seed)).bfloat16()


def _assert_close(y: torch.Tensor, ref: torch.Tensor) -> None:
    assert tuple(y.shape) == tuple(ref.shape)
    err = (y.float() - ref).abs()
    bound = TOL * ref.abs() + TOL * ref.pow(2).mean().sqrt()
    assert (err <= bound).all(), f"max err {err.max().item():.4g}"


def test_pack_order_matches_pack_vnni32():
    w = _w(40, 70)
    packed = ext.pack_bf16_vnni32(w)
    assert tuple(packed.shape) == (2, 48, 32, 2) and packed.dtype == torch.bfloat16
    t, p, j, i = 1, 17, 5, 1  # element [t, p, j, i] = w[32t + j, 2p + i]
    assert packed[t, p, j, i] == w[32 * t + j, 2 * p + i]
    assert packed[1, :, 8:].abs().sum() == 0 and packed[:, 35:].abs().sum() == 0  # padding


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("out_fp32", [False, True])
@pytest.mark.parametrize("m,n,k", [(1, 32, 64), (3, 48, 200), (7, 100, 40), (130, 300, 576)])
def test_matches_oracle(m, n, k, out_fp32, with_bias):
    w, x = _w(n, k), _x(m, k)
    bias = make_bias(n) if with_bias else None
    y = Bf16Gemm.prepare(w)(x, bias, out_fp32=out_fp32)
    assert y.dtype == (torch.float32 if out_fp32 else torch.bfloat16)
    ref = x.float() @ w.float().t() + (bias if bias is not None else 0)
    _assert_close(y, ref)


def test_fp32_output_is_the_unrounded_bf16_output():
    w, x = _w(64, 96), _x(5, 96)
    g = Bf16Gemm.prepare(w)
    assert torch.equal(g(x, out_fp32=True).bfloat16(), g(x))


def test_zero_rows_and_demo_head_shape():
    g = Bf16Gemm.prepare(_w(49152 // 16, 576))
    assert tuple(g(_x(0, 576)).shape) == (0, 3072)
    x = _x(2, 576)
    _assert_close(g(x), x.float() @ _w(3072, 576).float().t())


def test_layout_contracts():
    w = _w(64, 64)
    with pytest.raises(LayoutError, match="row-major"):
        Bf16Gemm.prepare(w.t())  # a transposed view is rejected, never reinterpreted
    with pytest.raises(LayoutError, match="bf16"):
        Bf16Gemm.prepare(w.float())
    g = Bf16Gemm.prepare(w)
    assert g.packed.layout == BF16_VNNI32_LAYOUT and g.packed.kernel_id == KERNEL_ID
    with pytest.raises(LayoutError, match="K=64"):
        g(_x(1, 60))
    with pytest.raises(RuntimeError, match="N/32, K/2, 32, 2"):
        ext.gemm_bf16_avx512(_x(1, 64), g.packed.tensors["weight"], None, 96)


def test_fake_impl_shapes():
    with FakeTensorMode():
        x = torch.empty(3, 70, dtype=torch.bfloat16)
        wp = torch.empty(2, 48, 32, 2, dtype=torch.bfloat16)
        assert torch.ops.fp8serve.gemm_bf16_avx512(x, wp, None, 40, True).shape == (3, 40)
        packed = torch.ops.fp8serve.pack_bf16_vnni32(torch.empty(40, 70, dtype=torch.bfloat16))
        assert tuple(packed.shape) == (2, 48, 32, 2)


def test_bf16_linear_routes_to_the_kernel_when_supported():
    w, x = _w(100, 64), _x(4, 64)
    fast = Bf16Linear("lm_head", w, fake_hw(*AVX512_HOST, *AVX2_HOST))
    assert fast.kernel_id == KERNEL_ID and fast.reason is None
    assert torch.equal(fast(x), Bf16Gemm.prepare(w)(x))
    assert torch.equal(fast.fp32(x), Bf16Gemm.prepare(w)(x, out_fp32=True))
    assert fast.weight.data_ptr() == w.data_ptr()  # a tied embedding is not copied
    # AVX2 without FMA/F16C: neither ISA kernel, the portable one (an AVX2_HOST takes
    # bf16_avx2, whose routing tests/kernels/test_bf16_gemm_avx2.py checks; the portable
    # kernel's, tests/kernels/test_portable_gemm.py)
    plain = Bf16Linear("lm_head", w, fake_hw("avx2"))
    assert plain.kernel_id == PORTABLE_KERNEL_ID and plain.reason is None
    # without the extension: torch.mm, and why
    slow = Bf16Linear("lm_head", w, HardwareInfo.fake(*AVX512_HOST, extension=ExtensionStatus(
        built=False, error="g++: command not found")))
    assert slow.kernel_id == "torch_mm" and "g++: command not found" in (slow.reason or "")
    assert slow.gemm() is None and torch.equal(slow(x), torch.mm(x, w.t()))
    _assert_close(fast(x), x.float() @ w.float().t())
    assert bf16_gemm_reason(fake_hw(*AVX512_HOST)) is None
    assert Bf16Linear("head", w).kernel_id == "torch_mm"  # no hardware profile given
