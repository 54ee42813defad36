"""Batch invariance in kernel choice: the registry's flag, trial order, report, CLI and
the startup warning when a layer runs a kernel whose rows depend on the batch."""

from __future__ import annotations

import logging

from cli.kernels import format_report
from engine.hardware import HardwareInfo
from engine.kernels.base import Fp8Spec, Platform, ScaleKind
from engine.kernels.layer_kernel import KernelReport, LayerChoice, exactness_warning
from engine.kernels.registry import (
    KernelCatalog,
    KernelOverrides,
    candidate_ids,
    first_choice,
    is_batch_invariant,
    select_kernel,
    table_infos,
)
from engine.kernels.report import build_kernel_report
from engine.runner import ModelRunner
from tests.engine.test_model_support import engine_config, random_weights, tiny_config
from tests.ext.support import AMX_HOST, AVX2_HOST, fake_hw
from tests.kernels.test_registry import FakeKernel, factory

SPEC = Fp8Spec(n=64, k=128, scale_kind=ScaleKind.PER_CHANNEL)


def _catalog() -> KernelCatalog:
    """torch_w8a16 (rows depend on the batch) listed ahead of avx2_w8a16 (they do not)."""
    exact = FakeKernel("avx2_w8a16")
    exact.batch_invariant = True  # type: ignore[misc]
    kernels = {"torch_w8a16": factory(FakeKernel("torch_w8a16")), "avx2_w8a16": factory(exact)}
    table = ("torch_w8a16", "avx2_w8a16")
    return KernelCatalog(kernels, {(Platform.CPU, ScaleKind.PER_CHANNEL): table})


def test_shipping_kernels_declare_batch_invariance():
    for kid in ("amx_w8a16", "amx_block_w8a16", "avx512_w8a16", "avx512_block_w8a16",
                "avx2_w8a16", "avx2_block_w8a16"):
        assert is_batch_invariant(kid), kid
    for kid in ("torch_w8a16", "torch_block_w8a16", "torch_scaled_mm_w8a8", "xpu_w8a16",
                "cuda_torch_w8a16"):
        assert not is_batch_invariant(kid), kid


def test_batch_invariant_kernel_is_tried_first():
    cat = _catalog()
    hw = HardwareInfo.fake()
    assert candidate_ids(Platform.CPU, ScaleKind.PER_CHANNEL, KernelOverrides(), cat) == [
        "avx2_w8a16", "torch_w8a16"]
    sel = select_kernel(SPEC, hw, catalog=cat)
    assert sel.kernel.id == "avx2_w8a16" and sel.first_choice == "avx2_w8a16"
    assert [f.id for f in sel.fallbacks] == ["torch_w8a16"]
    entries = table_infos(hw, catalog=cat)[0].entries
    assert [(e.kernel_id, e.batch_invariant) for e in entries] == [
        ("avx2_w8a16", True), ("torch_w8a16", False)]


def test_forcing_a_kernel_that_is_not_batch_invariant_wins_and_warns():
    cat = _catalog()
    forced = KernelOverrides(forced="torch_w8a16")
    sel = select_kernel(SPEC, HardwareInfo.fake(), forced, catalog=cat)
    assert sel.kernel.id == "torch_w8a16"
    assert first_choice(Platform.CPU, ScaleKind.PER_CHANNEL, HardwareInfo.fake(), forced,
                        cat) == "torch_w8a16"
    report = KernelReport()
    report.record_choice(LayerChoice("layers.0.q", "torch_w8a16", "cpu", "per_channel", 64,
                                     128, ()))
    note = exactness_warning(report, forced, cat) or ""
    assert note.startswith("exactness is off: torch_w8a16 (forced)")
    report.record_choice(LayerChoice("layers.0.q", "avx2_w8a16", "cpu", "per_channel", 64,
                                     128, ()))
    assert exactness_warning(report, forced, cat) is None


def test_report_and_cli_show_batch_invariance_on_an_amx_host():
    rep = build_kernel_report(fake_hw(*AMX_HOST, amx=True))
    cpu = next(t for t in rep["tables"] if t["name"] == "cpu/per_channel")
    flags = {e["kernel_id"]: e["batch_invariant"] for e in cpu["kernels"]}
    assert flags["amx_w8a16"] and flags["avx512_w8a16"] and not flags["torch_w8a16"]
    ids = [e["kernel_id"] for e in cpu["kernels"]]
    assert ids.index("torch_scaled_mm_w8a8") > ids.index("avx2_w8a16")
    text = format_report(rep)
    assert "amx_w8a16 [batch-invariant]" in text
    assert "torch_w8a16 [NOT batch-invariant]" in text


def test_runner_startup_log_says_exactness_is_off_when_forced(caplog):
    weights = random_weights(tiny_config(num_layers=1), seed=3)
    with caplog.at_level(logging.WARNING, logger="engine.runner"):
        ModelRunner(weights, engine_config(), fake_hw(*AVX2_HOST),
                    KernelOverrides(forced="torch_w8a16"))
    assert any("exactness is off: torch_w8a16 (forced)" in r.getMessage()
               for r in caplog.records)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="engine.runner"):
        ModelRunner(weights, engine_config(), fake_hw(*AVX2_HOST), KernelOverrides())
    assert not any("exactness is off" in r.getMessage() for r in caplog.records)


def test_bf16_linears_warn_only_on_torch_mm():
    """The bf16 head on a C++ bf16 kernel keeps exactness; on torch.mm (no extension) the
    startup warning names it."""
    report = KernelReport()
    report.record_choice(LayerChoice("lm_head", "bf16_portable", "cpu", "bf16", 320, 64, ()))
    assert exactness_warning(report, KernelOverrides()) is None
    report.record_choice(LayerChoice("lm_head", "torch_mm", "cpu", "bf16", 320, 64, ()))
    assert (exactness_warning(report, KernelOverrides()) or "").startswith(
        "exactness is off: torch_mm")
