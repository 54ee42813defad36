"""LayerKernel: selection recorded in the report, runtime fallback, metric counter data."""

from __future__ import annotations

import logging

import pytest
import torch

from engine.hardware import HardwareInfo
from engine.kernels.base import Platform, ScaleKind
from engine.kernels.layer_kernel import KernelReport, LayerKernel, forced_warnings
from engine.kernels.reference import random_fp8_weight, reference_linear
from engine.kernels.registry import KernelCatalog, KernelOverrides, NoKernelError
from tests.kernels.test_registry import FakeKernel

HW = HardwareInfo.fake("avx2", "fma", "f16c")
TABLE = ("avx512_w8a16", "avx2_w8a16", "torch_w8a16")


def catalog(*kernels: FakeKernel) -> KernelCatalog:
    return KernelCatalog(
        kernels={k.id: (lambda k=k: k) for k in kernels},
        priority={(Platform.CPU, ScaleKind.PER_TENSOR): TABLE,
                  (Platform.CPU, ScaleKind.PER_CHANNEL): TABLE})


def make(name: str, cat: KernelCatalog, report: KernelReport,
         kind: ScaleKind = ScaleKind.PER_TENSOR, bias: bool = False) -> LayerKernel:
    w = random_fp8_weight(32, 64, kind)
    b = torch.linspace(-1, 1, 32) if bias else None
    return LayerKernel(name, w, HW, KernelOverrides(), report, bias=b, catalog=cat)


def x() -> torch.Tensor:
    return torch.randn(3, 64, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)


def test_choice_is_recorded_with_rejections() -> None:
    report = KernelReport()
    cat = catalog(FakeKernel("avx512_w8a16", unsupported="no avx512f"),
                  FakeKernel("avx2_w8a16"), FakeKernel("torch_w8a16"))
    lk = make("layers.0.q_proj", cat, report)
    assert lk.kernel.id == "avx2_w8a16"
    choice = report.choices["layers.0.q_proj"]
    assert (choice.kernel_id, choice.platform, choice.scale_kind) == (
        "avx2_w8a16", "cpu", "per_tensor")
    assert (choice.n, choice.k) == (32, 64)
    assert [(r.kernel_id, r.reason) for r in choice.rejections] == [
        ("avx512_w8a16", "no avx512f")]
    assert report.selected_counts() == {("avx2_w8a16", "cpu", "per_tensor"): 1}
    assert report.rejection_counts() == {("avx512_w8a16", "no avx512f"): 1}
    assert report.fallback_counts() == {}


def test_kernel_raising_on_first_call_falls_back_and_is_recorded(caplog) -> None:
    report = KernelReport()
    flaky = FakeKernel("avx2_w8a16", fail_apply=1)
    cat = catalog(FakeKernel("avx512_w8a16", unsupported="no"), flaky,
                  FakeKernel("torch_w8a16"))
    lk = make("layers.3.down_proj", cat, report, bias=True)
    with caplog.at_level(logging.WARNING):
        y = lk(x())
    assert lk.kernel.id == "torch_w8a16"
    torch.testing.assert_close(y, reference_linear(lk.weight, x(), lk.bias).to(torch.bfloat16))
    assert "falling back to torch_w8a16" in caplog.text
    fb, = report.fallbacks
    assert (fb.layer, fb.from_kernel, fb.to_kernel, fb.stage) == (
        "layers.3.down_proj", "avx2_w8a16", "torch_w8a16", "apply")
    assert "RuntimeError: avx2_w8a16 exploded" in fb.error
    assert report.choices["layers.3.down_proj"].kernel_id == "torch_w8a16"
    assert report.fallback_counts() == {("avx2_w8a16", "torch_w8a16"): 1}
    assert report.selected_counts() == {("torch_w8a16", "cpu", "per_tensor"): 1}
    # the runtime failure joins the layer's rejections (and the rejection metric)
    assert any(r.kernel_id == "avx2_w8a16" and "runtime error" in r.reason
               for r in report.choices["layers.3.down_proj"].rejections)
    snap = report.snapshot()
    assert snap["runtime_fallbacks"][0]["to_kernel"] == "torch_w8a16"  # type: ignore[index]


def test_later_errors_propagate_without_fallback() -> None:
    report = KernelReport()
    first = FakeKernel("avx2_w8a16")
    cat = catalog(first, FakeKernel("torch_w8a16"))
    lk = make("l", cat, report)
    lk(x())
    first.fail_apply = 1
    with pytest.raises(RuntimeError, match="exploded"):
        lk(x())
    assert lk.kernel.id == "avx2_w8a16" and report.fallbacks == []


def test_fallback_chain_walks_several_kernels_then_gives_up() -> None:
    report = KernelReport()
    cat = catalog(FakeKernel("avx512_w8a16", fail_apply=1), FakeKernel("avx2_w8a16", fail_apply=1),
                  FakeKernel("torch_w8a16", fail_apply=1))
    lk = make("l", cat, report)
    with pytest.raises(NoKernelError, match="torch_w8a16 failed .*no fallback remains"):
        lk(x())
    assert [(f.from_kernel, f.to_kernel) for f in report.fallbacks] == [
        ("avx512_w8a16", "avx2_w8a16"), ("avx2_w8a16", "torch_w8a16")]


def test_prepare_failure_at_load_falls_back() -> None:
    report = KernelReport()
    cat = catalog(FakeKernel("avx512_w8a16", fail_prepare=1), FakeKernel("avx2_w8a16"))
    lk = make("l", cat, report)
    assert lk.kernel.id == "avx2_w8a16"
    fb, = report.fallbacks
    assert (fb.from_kernel, fb.to_kernel, fb.stage) == ("avx512_w8a16", "avx2_w8a16", "prepare")
    assert report.choices["l"].kernel_id == "avx2_w8a16"
    lk(x())


def test_forced_kernel_that_cannot_implement_warns_not_crashes(caplog) -> None:
    report = KernelReport()
    cat = catalog(FakeKernel("avx512_w8a16", kinds=frozenset({ScaleKind.PER_TENSOR})),
                  FakeKernel("avx2_w8a16"))
    w = random_fp8_weight(32, 64, ScaleKind.PER_CHANNEL)
    with caplog.at_level(logging.DEBUG):
        lk = LayerKernel("l", w, HW, KernelOverrides(forced="avx512_w8a16"), report,
                         catalog=cat)
    assert lk.kernel.id == "avx2_w8a16"
    assert "forced kernel avx512_w8a16 cannot run this layer" in caplog.text
    assert report.choices["l"].warning is not None
    # the startup log's line (engine/runner.py): grouped, with the layers it concerns
    assert forced_warnings(report) == [f"{report.choices['l'].warning}: 1 layer (l)"]


def test_real_default_catalog_runs_torch_kernel_when_forced() -> None:
    report = KernelReport()
    w = random_fp8_weight(48, 200, ScaleKind.PER_CHANNEL)
    lk = LayerKernel("l", w, HardwareInfo.fake(machine="aarch64"),
                     KernelOverrides(forced="torch_w8a16"), report)
    assert lk.kernel.id == "torch_w8a16"
    xs = torch.randn(5, 200).to(torch.bfloat16)
    ref = reference_linear(w, xs)
    assert (lk(xs).float() - ref).abs().max() <= 2e-2 * ref.abs().max()
