"""CUDA kernels: selection on fake hardware; the compute path on CPU tensors (torch allows
_scaled_mm on CPU). Not verified here: a real CUDA device (none on this machine)."""

from __future__ import annotations

import pytest
import torch

from engine.hardware import HardwareInfo
from engine.kernels.base import Fp8Spec, ScaleKind
from engine.kernels.cuda import CudaScaledMmW8A8, CudaTorchW8A16
from engine.kernels.reference import random_fp8_weight, reference_linear, reference_linear_w8a8
from engine.kernels.registry import KernelCatalog, select_kernel


def cuda_hw(cap: tuple[int, int] | None) -> HardwareInfo:
    return HardwareInfo.fake(cuda_available=True, cuda_capability=cap, cuda_name="fake")


CPU_TENSOR_CATALOG = KernelCatalog(kernels={
    "cuda_scaled_mm_w8a8": lambda: CudaScaledMmW8A8(device="cpu"),
    "cuda_torch_w8a16": lambda: CudaTorchW8A16(device="cpu"),
})


def close(y: torch.Tensor, ref: torch.Tensor) -> None:
    assert (y.float() - ref).abs().max() <= 1.5e-2 * ref.abs().max()


@pytest.mark.parametrize("cap", [(8, 9), (9, 0), (10, 0)])
@pytest.mark.parametrize("kind", [ScaleKind.PER_TENSOR, ScaleKind.PER_CHANNEL])
def test_fp8_capable_gpu_picks_scaled_mm(cap, kind) -> None:
    spec = Fp8Spec(4096, 4096, kind, has_activation_scale=True)
    sel = select_kernel(spec, cuda_hw(cap), catalog=CPU_TENSOR_CATALOG)
    assert sel.kernel.id == "cuda_scaled_mm_w8a8" and sel.rejections == ()
    assert [k.id for k in sel.fallbacks] == ["cuda_torch_w8a16"]


@pytest.mark.parametrize("cap", [(8, 0), (8, 6), None])
def test_older_gpu_falls_to_torch_with_capability_reason(cap) -> None:
    spec = Fp8Spec(4096, 4096, ScaleKind.PER_TENSOR, has_activation_scale=True)
    sel = select_kernel(spec, cuda_hw(cap), catalog=CPU_TENSOR_CATALOG)
    assert sel.kernel.id == "cuda_torch_w8a16"
    (rej,) = sel.rejections
    assert rej.kernel_id == "cuda_scaled_mm_w8a8" and "< 8.9" in rej.reason
    assert ("8.0" if cap == (8, 0) else "") in rej.reason


def test_real_catalog_reasons_on_capability_8_0_and_block() -> None:
    old = cuda_hw((8, 0))
    sel = select_kernel(Fp8Spec(64, 64, ScaleKind.PER_TENSOR, has_activation_scale=True), old)
    assert sel.kernel.id == "cuda_torch_w8a16"
    assert sel.rejections[0].reason == "compute capability 8.0 < 8.9 (no FP8 tensor cores)"
    blk = select_kernel(Fp8Spec(64, 64, ScaleKind.BLOCK), cuda_hw((9, 0)))
    assert blk.kernel.id == "cuda_torch_w8a16"


@pytest.mark.parametrize("spec,why", [
    (Fp8Spec(48, 200, ScaleKind.PER_TENSOR, has_activation_scale=True), "multiples of 16"),
    (Fp8Spec(64, 64, ScaleKind.PER_TENSOR), "activation_scale"),
    (Fp8Spec(64, 64, ScaleKind.BLOCK, has_activation_scale=True), "block not handled"),
])
def test_scaled_mm_rejections(spec: Fp8Spec, why: str) -> None:
    assert why in (CudaScaledMmW8A8().can_implement(spec) or "")
    sel = select_kernel(spec, cuda_hw((9, 0)), catalog=CPU_TENSOR_CATALOG)
    assert sel.kernel.id == "cuda_torch_w8a16"
    if spec.scale_kind is not ScaleKind.BLOCK:  # the block table has only the torch kernel
        assert why in sel.rejections[0].reason


def test_no_cuda_means_unsupported() -> None:
    cpu = HardwareInfo.fake("avx2")
    assert "no CUDA device" in (CudaScaledMmW8A8().is_supported(cpu) or "")
    assert "no CUDA device" in (CudaTorchW8A16().is_supported(cpu) or "")


@pytest.mark.parametrize("kind", [ScaleKind.PER_TENSOR, ScaleKind.PER_CHANNEL])
def test_scaled_mm_compute_path_on_cpu_tensors(kind: ScaleKind) -> None:
    w = random_fp8_weight(64, 128, kind)
    kern = CudaScaledMmW8A8(device="cpu")
    x = torch.randn(5, 128).to(torch.bfloat16)
    bias = torch.randn(64)
    close(kern.apply(kern.prepare(w), x, bias), reference_linear_w8a8(w, x, bias))


@pytest.mark.parametrize("kind", list(ScaleKind))
def test_torch_fallback_compute_path_on_cpu_tensors(kind: ScaleKind) -> None:
    w = random_fp8_weight(48, 200, kind)
    kern = CudaTorchW8A16(device="cpu")
    x = torch.randn(4, 200).to(torch.bfloat16)
    close(kern.apply(kern.prepare(w), x), reference_linear(w, x))
