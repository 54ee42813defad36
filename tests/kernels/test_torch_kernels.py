"""The pure-torch kernels against the fp32 oracle (engine/kernels/reference.py)."""

from __future__ import annotations

from functools import cache

import pytest
import torch

from engine.hardware import HardwareInfo
from engine.kernels.base import Fp8Spec, Fp8Weight, LayoutError, ScaleKind
from engine.kernels.reference import (
    dequantize,
    random_fp8_weight,
    reference_linear_w8a8,
)
from engine.kernels.registry import KernelCatalog, NoKernelError, select_kernel
from engine.kernels.torch_kernels import (
    DeviceTorchW8A16,
    TorchBlockW8A16,
    TorchScaledMmW8A8,
    TorchW8A16,
)

MS = (1, 3, 4, 5, 17, 64, 128)
SHAPES = ((32, 64), (1024, 4096), (4096, 4096), (48, 200))
# torch._scaled_mm on CPU can be a reference loop (about 15 M MAC/s on AMX hosts): small
# shapes with ragged N and K prove the same scale handling in seconds on every host
SCALED_MM_SHAPES = ((32, 64), (48, 200), (160, 384))
W8A16 = {ScaleKind.PER_TENSOR: TorchW8A16(), ScaleKind.PER_CHANNEL: TorchW8A16(),
         ScaleKind.BLOCK: TorchBlockW8A16()}


@cache
def layer(n: int, k: int, kind: ScaleKind, block: tuple[int, int] = (128, 128)):
    w = random_fp8_weight(n, k, kind, seed=n * 7 + k, block_size=block)
    bias = torch.randn(n, generator=torch.Generator().manual_seed(k)) * 0.1
    return w, dequantize(w), bias


def x_for(m: int, k: int) -> torch.Tensor:
    return torch.randn(m, k, generator=torch.Generator().manual_seed(m + k)).to(torch.bfloat16)


def assert_matches(y: torch.Tensor, ref: torch.Tensor) -> None:
    """bf16 output vs fp32 oracle: a few bf16 ulps of the output's magnitude."""
    assert y.dtype == torch.bfloat16 and y.shape == ref.shape
    tol = 1.5e-2 * ref.abs().max().item() + 1e-6
    err = (y.float() - ref).abs().max().item()
    assert err <= tol, f"max abs err {err:.3g} > {tol:.3g}"


@pytest.mark.parametrize("kind", list(ScaleKind), ids=lambda k: k.value)
@pytest.mark.parametrize("n,k", SHAPES, ids=lambda v: str(v))
@pytest.mark.parametrize("with_bias", [False, True], ids=["nobias", "bias"])
def test_w8a16_matches_oracle_for_every_m(kind: ScaleKind, n: int, k: int,
                                          with_bias: bool) -> None:
    w, wdq, bias = layer(n, k, kind)
    kern = W8A16[kind]
    assert kern.can_implement(Fp8Spec.of(w, with_bias)) is None
    packed = kern.prepare(w)
    assert packed.tensors["weight"].data_ptr() == w.weight.data_ptr()  # no copy on CPU
    b = bias if with_bias else None
    for m in MS:
        x = x_for(m, k)
        ref = x.float() @ wdq.t() + (bias if with_bias else 0.0)
        assert_matches(kern.apply(packed, x, b), ref)


@pytest.mark.parametrize("kind", [ScaleKind.PER_TENSOR, ScaleKind.PER_CHANNEL],
                         ids=lambda k: k.value)
@pytest.mark.parametrize("n,k", SCALED_MM_SHAPES, ids=lambda v: str(v))
def test_scaled_mm_matches_w8a8_oracle(kind: ScaleKind, n: int, k: int) -> None:
    w, _, bias = layer(n, k, kind)
    kern = TorchScaledMmW8A8()
    packed = kern.prepare(w)
    assert packed.tensors["weight_t"].data_ptr() == w.weight.data_ptr()
    for m, b in ((1, None), (5, bias), (17, None), (128, bias)):
        x = x_for(m, k)
        assert_matches(kern.apply(packed, x, b), reference_linear_w8a8(w, x, b))


def test_block_tails_with_small_blocks() -> None:
    """N and K not multiples of the block, several blocks each way."""
    w, wdq, bias = layer(48, 200, ScaleKind.BLOCK, (16, 64))
    assert tuple(w.scale.shape) == (3, 4)
    kern = TorchBlockW8A16()
    packed = kern.prepare(w)
    for m in (1, 5, 17):
        x = x_for(m, 200)
        assert_matches(kern.apply(packed, x, bias), x.float() @ wdq.t() + bias)


def test_scratch_buffer_shared_across_layers_stays_correct() -> None:
    kern = TorchW8A16()
    a, adq, _ = layer(1024, 4096, ScaleKind.PER_TENSOR)
    b, bdq, _ = layer(32, 64, ScaleKind.PER_CHANNEL)
    pa, pb = kern.prepare(a), kern.prepare(b)
    xa, xb = x_for(3, 4096), x_for(3, 64)
    for _ in range(2):
        assert_matches(kern.apply(pa, xa), xa.float() @ adq.t())
        assert_matches(kern.apply(pb, xb), xb.float() @ bdq.t())


def test_empty_batch() -> None:
    w, _, _ = layer(32, 64, ScaleKind.PER_TENSOR)
    for kern in (TorchW8A16(), TorchScaledMmW8A8()):
        y = kern.apply(kern.prepare(w), torch.empty(0, 64, dtype=torch.bfloat16))
        assert y.shape == (0, 32) and y.dtype == torch.bfloat16


def _transposed_view(n: int) -> Fp8Weight:
    """An [N, K] *view* of a [K, N] tensor with N == K: same shape as the real thing."""
    w = random_fp8_weight(n, n, ScaleKind.PER_TENSOR)
    kn = w.weight.t().contiguous()  # what a [K, N] loader would hold
    return Fp8Weight(kn.t(), w.scale, w.scale_kind, w.activation_scale)


@pytest.mark.parametrize("kern", [TorchW8A16(), TorchBlockW8A16(), TorchScaledMmW8A8(),
                                  DeviceTorchW8A16()], ids=lambda k: k.id)
def test_non_contiguous_square_weight_is_rejected_with_a_reason(kern) -> None:
    view = _transposed_view(64)
    assert view.weight.shape == (64, 64) and not view.weight.is_contiguous()
    reason = kern.can_implement(Fp8Spec.of(view))
    assert reason is not None and "contiguous" in reason
    with pytest.raises(LayoutError, match="row-major"):
        kern.prepare(view)


def test_registry_never_silently_runs_a_transposed_view() -> None:
    view = _transposed_view(64)
    cat = KernelCatalog(kernels={"torch_w8a16": TorchW8A16,
                                 "torch_scaled_mm_w8a8": TorchScaledMmW8A8})
    with pytest.raises(NoKernelError, match="torch_w8a16: weight is not a row-major"):
        select_kernel(Fp8Spec.of(view), HardwareInfo.fake(), catalog=cat)


def test_scaled_mm_needs_activation_scale_and_rejects_block() -> None:
    kern = TorchScaledMmW8A8()
    w = random_fp8_weight(32, 64, ScaleKind.PER_TENSOR, activation_scale=None)
    assert "activation_scale" in (kern.can_implement(Fp8Spec.of(w)) or "")
    with pytest.raises(ValueError, match="activation_scale"):
        kern.prepare(w)
    blk = random_fp8_weight(32, 64, ScaleKind.BLOCK)
    assert "block" in (kern.can_implement(Fp8Spec.of(blk)) or "")


def test_scale_kind_mismatch_rejected() -> None:
    blk = random_fp8_weight(32, 64, ScaleKind.BLOCK)
    assert "block not handled" in (TorchW8A16().can_implement(Fp8Spec.of(blk)) or "")
    pt = random_fp8_weight(32, 64, ScaleKind.PER_TENSOR)
    assert "per_tensor not handled" in (TorchBlockW8A16().can_implement(Fp8Spec.of(pt)) or "")
    with pytest.raises(ValueError):
        TorchBlockW8A16().prepare(pt)


def test_wrong_activation_shape_raises() -> None:
    w, _, _ = layer(32, 64, ScaleKind.PER_TENSOR)
    kern = TorchW8A16()
    with pytest.raises(ValueError, match=r"bf16 \[M, 64\]"):
        kern.apply(kern.prepare(w), torch.zeros(2, 32, dtype=torch.bfloat16))


def test_torch_kernels_run_on_arm() -> None:
    arm = HardwareInfo.fake(machine="aarch64")
    for kern in (TorchW8A16(), TorchBlockW8A16(), TorchScaledMmW8A8()):
        assert kern.is_supported(arm) is None


def test_packed_weight_of_another_kernel_is_refused() -> None:
    w, _, _ = layer(32, 64, ScaleKind.PER_TENSOR)
    packed = TorchScaledMmW8A8().prepare(w)
    with pytest.raises(LayoutError, match="prepared by torch_scaled_mm_w8a8"):
        TorchW8A16().apply(packed, x_for(1, 64))


def test_scratch_buffer_works_inside_and_outside_inference_mode() -> None:
    """The reused bf16 scratch is created by whichever caller comes first; a buffer born
    inside torch.inference_mode must still be writable by a later caller outside it."""
    kernel = TorchW8A16()
    w = random_fp8_weight(64, 128, ScaleKind.PER_TENSOR, seed=3)
    packed = kernel.prepare(w)
    x = torch.randn(2, 128).to(torch.bfloat16)
    with torch.inference_mode():
        inside = kernel.apply(packed, x)
    outside = kernel.apply(packed, x)
    torch.testing.assert_close(inside, outside, rtol=0, atol=0)
