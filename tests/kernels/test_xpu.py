"""XPU kernels with an injected oneDNN op. This machine has no XPU: the kernels run on CPU
tensors (device="cpu") with a fake HardwareInfo(xpu_available=True)."""

from __future__ import annotations

import pytest
import torch

from engine.hardware import HardwareInfo
from engine.kernels.base import Fp8Spec, ScaleKind
from engine.kernels.reference import random_fp8_weight, reference_linear
from engine.kernels.registry import KernelCatalog, KernelOverrides, select_kernel
from engine.kernels.xpu import XpuBlockFp8, XpuTorchW8A16, XpuW8A16, default_w8a16_op

XPU_HW = HardwareInfo.fake(xpu_available=True, xpu_name="fake Arc")


class RecordingBlockOp:
    """Stands in for the oneDNN op: reads the scale as [k_blocks, n_blocks]."""

    def __init__(self) -> None:
        self.seen: list[dict[str, object]] = []

    def __call__(self, x, w, scale_kn, block_size, bias):
        self.seen.append({"scale_kn": scale_kn, "block_size": block_size})
        assert scale_kn.is_contiguous()
        bn, bk = block_size
        s = scale_kn.repeat_interleave(bk, 0).repeat_interleave(bn, 1)  # [K', N']
        wf = w.float() * s[: w.shape[1], : w.shape[0]].t()
        y = x.float() @ wf.t()
        return (y + bias if bias is not None else y).to(torch.bfloat16)


def w8a16_op(x, w, scale, bias):
    s = scale if scale.dim() == 0 else scale[:, None]
    y = x.float() @ (w.float() * s).t()
    return (y + bias if bias is not None else y).to(torch.bfloat16)


def close(y: torch.Tensor, ref: torch.Tensor) -> None:
    assert (y.float() - ref).abs().max() <= 1.5e-2 * ref.abs().max()


def test_block_scale_is_one_contiguous_kn_buffer_seen_as_nk_view() -> None:
    w = random_fp8_weight(300, 520, ScaleKind.BLOCK)  # 3 x 5 blocks with tails
    op = RecordingBlockOp()
    kern = XpuBlockFp8(op=op, device="cpu")
    packed = kern.prepare(w)
    kn, nk = packed.tensors["scale_kn"], packed.tensors["scale"]
    assert kn.shape == (5, 3) and kn.is_contiguous()
    assert nk.shape == (3, 5) and not nk.is_contiguous()
    assert nk.data_ptr() == kn.data_ptr()  # a view, not a copy
    torch.testing.assert_close(nk, w.scale, rtol=0, atol=0)  # the consumer's [nb, kb] read
    assert nk[2, 4].item() == w.scale[2, 4].item() == kn[4, 2].item()
    x = torch.randn(5, 520).to(torch.bfloat16)
    bias = torch.randn(300)
    close(kern.apply(packed, x, bias), reference_linear(w, x, bias))
    got = op.seen[0]["scale_kn"]
    assert isinstance(got, torch.Tensor) and got.data_ptr() == kn.data_ptr()
    assert op.seen[0]["block_size"] == (128, 128)


@pytest.mark.parametrize("kind", [ScaleKind.PER_TENSOR, ScaleKind.PER_CHANNEL])
def test_w8a16_calls_op_with_canonical_weight(kind: ScaleKind) -> None:
    w = random_fp8_weight(48, 200, kind)
    calls = []

    def op(x, wt, s, b):
        calls.append((wt.shape, wt.is_contiguous(), s.shape))
        return w8a16_op(x, wt, s, b)

    kern = XpuW8A16(op=op, device="cpu")
    x = torch.randn(3, 200).to(torch.bfloat16)
    close(kern.apply(kern.prepare(w), x), reference_linear(w, x))
    assert calls == [((48, 200), True, tuple(w.scale.shape))]


@pytest.mark.parametrize("kind", list(ScaleKind))
def test_xpu_torch_fallback_every_scale_kind(kind: ScaleKind) -> None:
    w = random_fp8_weight(48, 200, kind)
    kern = XpuTorchW8A16(device="cpu")
    assert kern.is_supported(XPU_HW) is None
    x = torch.randn(17, 200).to(torch.bfloat16)
    close(kern.apply(kern.prepare(w), x), reference_linear(w, x))


def test_without_xpu_or_op_the_kernels_say_why() -> None:
    cpu = HardwareInfo.fake("avx2")
    assert "no XPU device" in (XpuTorchW8A16(device="cpu").is_supported(cpu) or "")
    assert "no XPU device" in (XpuW8A16(op=w8a16_op).is_supported(cpu) or "")
    no_op = XpuW8A16(op=None)
    if default_w8a16_op() is None:  # true on this machine (no XPU build of torch)
        assert "no oneDNN FP8 GEMM op registered" in (no_op.is_supported(XPU_HW) or "")
        assert "torch.ops._xpu_C.fp8_gemm_w8a16" in (no_op.is_supported(XPU_HW) or "")


def test_non_contiguous_weight_rejected() -> None:
    w = random_fp8_weight(64, 64, ScaleKind.PER_TENSOR)
    spec = Fp8Spec(64, 64, ScaleKind.PER_TENSOR, weight_contiguous=False)
    assert "contiguous" in (XpuW8A16(op=w8a16_op).can_implement(spec) or "")
    assert Fp8Spec.of(w).weight_contiguous


def _xpu_catalog(with_op: bool) -> KernelCatalog:
    return KernelCatalog(kernels={
        "xpu_w8a16": lambda: XpuW8A16(op=w8a16_op if with_op else None, device="cpu"),
        "xpu_block_fp8": lambda: XpuBlockFp8(op=RecordingBlockOp() if with_op else None,
                                             device="cpu"),
        "xpu_torch_w8a16": lambda: XpuTorchW8A16(device="cpu"),
    })


@pytest.mark.parametrize("kind,want", [(ScaleKind.PER_TENSOR, "xpu_w8a16"),
                                       (ScaleKind.PER_CHANNEL, "xpu_w8a16"),
                                       (ScaleKind.BLOCK, "xpu_block_fp8")])
def test_xpu_table_prefers_the_op_then_torch(kind: ScaleKind, want: str) -> None:
    spec = Fp8Spec(4096, 4096, kind)
    assert select_kernel(spec, XPU_HW, catalog=_xpu_catalog(True)).kernel.id == want
    sel = select_kernel(spec, XPU_HW, catalog=_xpu_catalog(False))
    assert sel.kernel.id == "xpu_torch_w8a16"
    assert sel.rejections[0].kernel_id == want
    assert "no oneDNN FP8 GEMM op" in sel.rejections[0].reason
    off = KernelOverrides(disabled=frozenset({want}))
    assert select_kernel(spec, XPU_HW, off, catalog=_xpu_catalog(True)).kernel.id == \
        "xpu_torch_w8a16"
