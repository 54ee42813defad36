"""The portable GEMMs (gemm_portable, gemm_bf16_portable; ext/csrc/fp8_gemm_portable.cpp),
on every host: bitwise equal to their arithmetic written out in torch (one fp32 chain per
output, multiply then add, in k order; block scales folded per k-block), so bitwise
batch-invariant; every FP8 code widened exactly; their layout contracts; and the kernel
classes and registry entries that serve them below AVX2."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import ext
from engine.kernels.base import Fp8Spec, Fp8Weight, ScaleKind
from engine.kernels.bf16_linear import PORTABLE_KERNEL_ID, Bf16Gemm, choose_bf16_kernel
from engine.kernels.portable import PortableBlockW8A16, PortableW8A16
from engine.kernels.registry import select_kernel
from tests.ext.support import fake_hw, make_bias, make_weight
from tests.kernels.test_batch_invariance import _assert_invariant, _dequant, _x

N, K = 200, 417  # ragged N (13 tiles of 16, the last partial), K past one 256-deep chunk


def _chain(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """fp32 [M, N]: for k in order, acc = acc + x[:, k] * w[:, k], each op rounded to fp32
    (torch's elementwise fp32 mul and add), from acc = 0."""
    acc = torch.zeros(x.shape[0], w.shape[0])
    for k in range(x.shape[1]):
        acc = acc + x[:, k:k + 1] * w[None, :, k]
    return acc


def _oracle(x: torch.Tensor, wt: Fp8Weight, bias: torch.Tensor | None) -> torch.Tensor:
    """The portable kernel's result, written out: bf16 [M, N]."""
    xf, wf = x.float(), wt.weight.float()
    if wt.scale_kind is ScaleKind.BLOCK:
        bn, bk = wt.block_size
        acc = None
        for b in range(0, wt.k, bk):
            part = _chain(xf[:, b:b + bk], wf[:, b:b + bk])
            s = wt.scale[:, b // bk].repeat_interleave(bn)[: wt.n]
            acc = part * s if acc is None else acc + part * s
    else:
        acc = _chain(xf, wf) * wt.scale.expand(wt.n)
    if bias is not None:
        acc = acc + bias
    return acc.bfloat16()


CASES = [(PortableW8A16(), ScaleKind.PER_TENSOR, (128, 128)),
         (PortableW8A16(), ScaleKind.PER_CHANNEL, (128, 128)),
         (PortableBlockW8A16(), ScaleKind.BLOCK, (128, 128)),
         (PortableBlockW8A16(), ScaleKind.BLOCK, (32, 64)),
         (PortableBlockW8A16(), ScaleKind.BLOCK, (64, 32))]
IDS = ["per-tensor", "per-channel", "block-128", "block-32x64", "block-64x32"]


@pytest.mark.parametrize("kernel,kind,block", CASES, ids=IDS)
def test_equals_its_arithmetic_bit_for_bit(kernel, kind, block):
    """Against a bias cancelling row 0's product, row 0 is rounding residue, where another
    summation order shows (measured: k reversed, or torch's matmul, differ in 25-50% of
    its outputs)."""
    w = make_weight(N, K, kind, seed=3, block=block)
    packed = kernel.prepare(w)
    for m in (1, 6, 9):
        x = _x(m, K, seed=m)
        for bias in (None, make_bias(N), -(x[:1].double() @ _dequant(w).double().t())[0].float()):
            assert torch.equal(kernel.apply(packed, x, bias), _oracle(x, w, bias)), m


@pytest.mark.parametrize("kernel,kind,block", CASES, ids=IDS)
def test_row_is_bitwise_batch_invariant(kernel, kind, block):
    """Rows alone or at any place of any batch (row groups of 4, widened-buffer path past
    4 rows), against a cancelling bias that leaves only rounding residue."""
    w = make_weight(N, K, kind, seed=5, block=block)
    packed = kernel.prepare(w)
    _assert_invariant(lambda x, b: kernel.apply(packed, x, b), _dequant(w),
                      [2, 3, 4, 5, 6, 7, 9, 33, 130])


def test_thread_count_does_not_change_bits():
    kernel = PortableW8A16()
    w = make_weight(N, K, ScaleKind.PER_CHANNEL, seed=8)
    packed, x = kernel.prepare(w), _x(11, K, seed=9)
    before = torch.get_num_threads()
    try:
        outs = []
        for t in (1, 2, 3):
            torch.set_num_threads(t)
            outs.append(kernel.apply(packed, x))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1]) and torch.equal(outs[0], outs[2])


def test_every_code_widens_exactly():
    """One-hot rows read single weights: y[r, n] = value(code) * 2^-4 exactly, for all 254
    non-NaN e4m3 codes (subnormals included)."""
    codes = torch.tensor([c for c in range(256) if c & 0x7F != 0x7F], dtype=torch.uint8)
    n, k = 16, 16
    flat = codes.repeat(-(-n * k // codes.numel()))[: n * k]
    w = Fp8Weight(flat.view(n, k).view(torch.float8_e4m3fn), torch.tensor(2.0**-4),
                  ScaleKind.PER_TENSOR)
    kernel = PortableW8A16()
    y = kernel.apply(kernel.prepare(w), torch.eye(k, dtype=torch.bfloat16))
    assert torch.equal(y.float(), (w.weight.float() * 2.0**-4).t())


def test_bf16_gemm_equals_its_arithmetic_and_is_batch_invariant():
    g = torch.Generator().manual_seed(0)
    w = (torch.randn(90, 300, generator=g) * 0.05).bfloat16()
    gemm = Bf16Gemm.prepare(w, PORTABLE_KERNEL_ID)
    x = _x(7, 300, seed=2)
    bias = make_bias(90)
    want = _chain(x.float(), w.float()) + bias
    assert torch.equal(gemm(x, bias, out_fp32=True), want)
    assert torch.equal(gemm(x, bias), want.bfloat16())
    for r in (0, 3, 6):
        assert torch.equal(gemm(x[r:r + 1], bias, out_fp32=True)[0], want[r])


def test_layout_contracts_name_the_op_and_the_shape():
    x = _x(3, 64, seed=1)
    w = make_weight(40, 64, ScaleKind.PER_CHANNEL)
    wp = ext.pack_avx2(w.weight)
    with pytest.raises(RuntimeError, match=r"gemm_portable: w_packed must be \[N/16, K, 16\]"):
        ext.gemm_portable(x, wp, w.scale, None, 50)
    with pytest.raises(RuntimeError, match="gemm_portable: per-channel scale must be"):
        ext.gemm_portable(x, wp, w.scale[:7], None, 40)
    with pytest.raises(RuntimeError, match=r"gemm_portable: block size \(16, 32\) must be"):
        ext.gemm_portable(x, wp, torch.ones(3, 2), None, 40, 16, 32)
    with pytest.raises(RuntimeError, match="gemm_portable: bias must be"):
        ext.gemm_portable(x, wp, w.scale, torch.ones(3), 40)
    wb = ext.pack_bf16_avx2(torch.zeros(40, 64, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match=r"gemm_bf16_portable: w_packed must be"):
        ext.gemm_bf16_portable(x[:, :32], wb, None, 40, False)
    assert ext.gemm_portable(x[:0], wp, w.scale, None, 40).shape == (0, 40)


def test_fake_impl_shapes():
    with FakeTensorMode():
        x = torch.empty(3, 70, dtype=torch.bfloat16)
        wp = torch.empty(3, 70, 16, dtype=torch.float8_e4m3fn)
        s = torch.empty(40)
        assert torch.ops.fp8serve.gemm_portable(x, wp, s, None, 40).shape == (3, 40)
        wb = torch.empty(3, 70, 16, dtype=torch.bfloat16)
        out = torch.ops.fp8serve.gemm_bf16_portable(x, wb, None, 40, True)
        assert out.shape == (3, 40) and out.dtype == torch.float32


def test_hosts_below_avx2_are_served_by_the_portable_kernels():
    """A host without AVX2 (an x86-64-v2 virtual CPU, say) with the extension built:
    every FP8 scale kind and the bf16 head get a batch-invariant kernel, and why the ones
    above were passed over is recorded."""
    hw = fake_hw()
    for kind, want in ((ScaleKind.PER_TENSOR, "portable_w8a16"),
                       (ScaleKind.PER_CHANNEL, "portable_w8a16"),
                       (ScaleKind.BLOCK, "portable_block_w8a16")):
        sel = select_kernel(Fp8Spec(4096, 4096, kind, has_activation_scale=True), hw)
        assert sel.kernel.id == want and sel.kernel.batch_invariant
        assert [r.kernel_id for r in sel.rejections][-1].startswith("avx2")
    assert choose_bf16_kernel(hw) == (PORTABLE_KERNEL_ID, None)
