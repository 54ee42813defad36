"""The CUDA kernels on a real CUDA device: the probe, the registry's choice with the
default catalog, numerics against the fp32 oracle, and the runtime fallback.

These need a GPU and are skipped elsewhere (CI has none). On a GPU host:
``python -m pytest -q tests/device``. The selection logic itself is covered without a
device in tests/kernels/test_cuda.py."""

from __future__ import annotations

import pytest
import torch

from engine.hardware_probe import probe_hardware
from engine.kernels.base import Fp8Spec, ScaleKind
from engine.kernels.cuda import MIN_FP8_CAPABILITY
from engine.kernels.layer_kernel import KernelReport, LayerKernel
from engine.kernels.reference import random_fp8_weight, reference_linear, reference_linear_w8a8
from engine.kernels.registry import KernelOverrides, get_kernel, select_kernel

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(),
                                reason="needs a CUDA device (none visible to torch)")

SHAPES = [(4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (48, 256)]
MS = [1, 7, 128, 512]


@pytest.fixture(scope="module")
def hw():
    return probe_hardware(ext=None)


def fp8_capable() -> bool:
    return torch.cuda.get_device_capability(0) >= MIN_FP8_CAPABILITY


def rel_err(y: torch.Tensor, ref: torch.Tensor) -> float:
    return float((y.float().cpu() - ref).abs().max() / ref.abs().max())


def test_probe_reports_the_device(hw) -> None:
    assert hw.cuda_available
    assert tuple(hw.cuda_capability) == torch.cuda.get_device_capability(0)
    assert hw.cuda_name == torch.cuda.get_device_name(0)


@pytest.mark.parametrize("kind", [ScaleKind.PER_TENSOR, ScaleKind.PER_CHANNEL])
def test_registry_picks_scaled_mm_on_fp8_tensor_cores(hw, kind) -> None:
    sel = select_kernel(Fp8Spec(4096, 4096, kind, has_activation_scale=True), hw)
    want = "cuda_scaled_mm_w8a8" if fp8_capable() else "cuda_torch_w8a16"
    assert sel.kernel.id == want


def test_registry_rejects_unaligned_shape_with_reason(hw) -> None:
    sel = select_kernel(Fp8Spec(48, 200, ScaleKind.PER_TENSOR, has_activation_scale=True), hw)
    assert sel.kernel.id == "cuda_torch_w8a16"
    assert any("multiples of 16" in r.reason or "capability" in r.reason
               for r in sel.rejections)


@pytest.mark.parametrize("n,k", SHAPES)
@pytest.mark.parametrize("kind", [ScaleKind.PER_TENSOR, ScaleKind.PER_CHANNEL])
def test_scaled_mm_matches_w8a8_oracle(n, k, kind) -> None:
    if not fp8_capable():
        pytest.skip("compute capability < 8.9: no FP8 tensor cores")
    kern = get_kernel("cuda_scaled_mm_w8a8")
    w = random_fp8_weight(n, k, kind, seed=n + k)
    packed = kern.prepare(w)
    assert packed.tensors["weight_t"].device.type == "cuda"
    bias = torch.randn(n)
    for m in MS:
        x = (torch.randn(m, k) * 2).to(torch.bfloat16)
        y = kern.apply(packed, x.cuda(), bias.cuda())
        assert y.shape == (m, n) and y.dtype == torch.bfloat16 and y.is_cuda
        assert rel_err(y, reference_linear_w8a8(w, x, bias)) < 1.5e-2, (m, n, k)


@pytest.mark.parametrize("n,k", SHAPES[:2] + [(48, 200)])
@pytest.mark.parametrize("kind", list(ScaleKind))
def test_torch_w8a16_matches_oracle(n, k, kind) -> None:
    kern = get_kernel("cuda_torch_w8a16")
    w = random_fp8_weight(n, k, kind, seed=n * 3 + k)
    packed = kern.prepare(w)
    for m in MS:
        x = torch.randn(m, k).to(torch.bfloat16)
        y = kern.apply(packed, x.cuda())
        assert y.shape == (m, n) and y.is_cuda
        assert rel_err(y, reference_linear(w, x)) < 1.5e-2, (m, n, k)


def test_layer_falls_back_at_run_time_on_the_device(hw, monkeypatch) -> None:
    """The first-choice kernel raising on its first call moves the layer to the next
    kernel of the chain, which then computes the right answer on the GPU."""
    report = KernelReport()
    w = random_fp8_weight(256, 512, ScaleKind.PER_TENSOR)
    layer = LayerKernel("layers.0.mlp.down_proj", w, hw, KernelOverrides(), report)
    first = layer.kernel.id

    def broken(*args, **kwargs):
        raise RuntimeError("injected failure")

    monkeypatch.setattr(type(layer.kernel), "apply", broken)
    x = torch.randn(5, 512).to(torch.bfloat16)
    y = layer(x.cuda())
    if first == "cuda_torch_w8a16":  # nothing left to fall back to would have raised
        pytest.fail("expected a chain below the first choice")
    assert layer.kernel.id == "cuda_torch_w8a16"
    assert report.fallback_counts() == {(first, "cuda_torch_w8a16"): 1}
    assert rel_err(y, reference_linear(w, x)) < 1.5e-2
