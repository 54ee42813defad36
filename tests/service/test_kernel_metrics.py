"""service/kernel_metrics.py on a real KernelReport filled by LayerKernel with scripted
kernels: per-group kernel gauge, startup fallbacks (not confused with runtime ones)."""

from __future__ import annotations

import torch
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.registry import Collector

from engine.hardware import HardwareInfo
from engine.kernels.base import Platform, ScaleKind
from engine.kernels.layer_kernel import (
    GENERATED_ROWS_STAGE,
    KernelReport,
    LayerChoice,
    LayerKernel,
    RuntimeFallback,
)
from engine.kernels.reference import random_fp8_weight
from engine.kernels.registry import KernelCatalog, KernelOverrides
from service.kernel_metrics import kernel_families, layer_group, startup_kernels
from tests.kernels.test_registry import FakeKernel

HW = HardwareInfo.fake("avx2", "fma", "f16c")
TABLE = ("avx512_w8a16", "avx2_w8a16", "torch_w8a16")


class _Snapshot(Collector):
    def __init__(self, report: KernelReport) -> None:
        self.report = report

    def collect(self):
        yield from kernel_families(self.report.snapshot())


def _model(report: KernelReport) -> list[LayerKernel]:
    """Four layers; the host runs avx2 (avx512 unsupported). qkv_proj: avx2 cannot run
    its shape (startup fallback to torch); down_proj: avx2 raises on the first call
    (runtime fallback, startup kernel avx2); o_proj, lm_head: avx2, nothing to report."""
    def cat(cannot: str | None = None, fail_apply: int = 0) -> KernelCatalog:
        ks = (FakeKernel("avx512_w8a16", unsupported="no avx512f"),
              FakeKernel("avx2_w8a16", cannot=cannot, fail_apply=fail_apply),
              FakeKernel("torch_w8a16"))
        return KernelCatalog(kernels={k.id: (lambda k=k: k) for k in ks},
                             priority={(Platform.CPU, ScaleKind.PER_TENSOR): TABLE})
    specs = [("model.layers.0.self_attn.qkv_proj", cat(cannot="N not a multiple of 16")),
             ("model.layers.0.self_attn.o_proj", cat()),
             ("model.layers.0.mlp.down_proj", cat(fail_apply=1)),
             ("lm_head", cat())]
    out = []
    for name, c in specs:
        w = random_fp8_weight(32, 64, ScaleKind.PER_TENSOR)
        out.append(LayerKernel(name, w, HW, KernelOverrides(), report, catalog=c))
    return out


def _scrape(report: KernelReport) -> str:
    registry = CollectorRegistry()
    registry.register(_Snapshot(report))
    return generate_latest(registry).decode()


def test_layer_group_is_the_last_name_component():
    assert layer_group("model.layers.12.mlp.gate_up_proj") == "gate_up_proj"
    assert layer_group("model.layers.1.self_attn.qkv_proj.k_proj") == "k_proj"
    assert layer_group("lm_head") == "lm_head"


def test_group_kernels_and_startup_fallbacks_before_and_after_a_runtime_fallback():
    report = KernelReport()
    layers = _model(report)
    text = _scrape(report)
    for group, kernel in (("qkv_proj", "torch_w8a16"), ("o_proj", "avx2_w8a16"),
                          ("down_proj", "avx2_w8a16"), ("lm_head", "avx2_w8a16")):
        assert (f'fp8serve_layer_group_kernel{{kernel="{kernel}",layer_group="{group}"}} 1.0'
                in text), group
    assert ('fp8serve_kernel_startup_fallbacks{from_kernel="avx2_w8a16",'
            'layer_group="qkv_proj",to_kernel="torch_w8a16"} 1.0') in text
    assert text.count("fp8serve_kernel_startup_fallbacks{") == 1

    layers[2](torch.randn(2, 64).to(torch.bfloat16))  # down_proj: avx2 fails, -> torch
    assert startup_kernels(report.snapshot())["model.layers.0.mlp.down_proj"] == "avx2_w8a16"
    text = _scrape(report)
    assert ('fp8serve_layer_group_kernel{kernel="torch_w8a16",layer_group="down_proj"} 1.0'
            in text)
    assert ('fp8serve_kernel_runtime_fallbacks_total{from_kernel="avx2_w8a16",'
            'to_kernel="torch_w8a16"} 1.0') in text
    # a runtime fallback is not a startup fallback
    assert text.count("fp8serve_kernel_startup_fallbacks{") == 1
    assert 'layer_group="down_proj",to_kernel' not in text


def test_empty_report_exports_the_gauges_without_samples():
    text = _scrape(KernelReport())
    for name in ("kernel_selected", "layer_group_kernel", "kernel_startup_fallbacks"):
        assert f"# TYPE fp8serve_{name} " in text
        assert f"\nfp8serve_{name}{{" not in text


def test_decoder_layer_paths_are_a_gauge_by_path_and_reason():
    """Each decoder layer's path, read live from the model's reasons: a fused layer whose
    op failed at runtime moves to path python with its error; a long reason is cut."""
    report = KernelReport()
    reasons: list[str | None] = [None, None, "fusion disabled"]
    report.decoder_reasons = lambda: reasons
    text = _scrape(report)
    assert 'fp8serve_decoder_layers{path="fused",reason=""} 2.0' in text
    assert 'fp8serve_decoder_layers{path="python",reason="fusion disabled"} 1.0' in text
    reasons[1] = "runtime error: " + "x" * 400
    text = _scrape(report)
    assert 'fp8serve_decoder_layers{path="fused",reason=""} 1.0' in text
    assert f'reason="runtime error: {"x" * 145}"}} 1.0' in text  # 160 characters
    assert report.snapshot()["decoder_layers"][1] == {
        "index": 1, "path": "python", "reason": reasons[1]}


def test_no_model_no_decoder_layers():
    assert KernelReport().snapshot()["decoder_layers"] == []
    assert "fp8serve_decoder_layers{" not in _scrape(KernelReport())


def test_a_models_bf16_head_shows_as_a_layer_on_its_kernel():
    """A real model's report: the bf16 lm_head is a layer of group lm_head on its bf16
    kernel, selected with scale_kind bf16; no startup fallback (it got its first choice)."""
    from engine.runner import ModelRunner
    from tests.engine.test_model_support import engine_config, random_weights, tiny_config
    from tests.ext.support import fake_hw

    runner = ModelRunner(random_weights(tiny_config()), engine_config(), fake_hw(),
                         KernelOverrides())
    head = runner.kernel_report.choices["lm_head"]
    assert head.kernel_id == "bf16_portable"  # a host below AVX2, the extension built
    text = _scrape(runner.kernel_report)
    assert 'fp8serve_layer_group_kernel{kernel="bf16_portable",layer_group="lm_head"} 1.0' in text
    assert ('fp8serve_kernel_selected{kernel="bf16_portable",platform="cpu",scale_kind="bf16"}'
            ' 1.0') in text
    assert "fp8serve_kernel_startup_fallbacks{" not in text


def test_a_generated_rows_fallback_is_not_a_startup_fallback():
    """An AMX host's layer got its first choice (amx_w8a16) at load; its generated rows'
    kernel (avx512_w8a16) failing later is a runtime fallback, and the layer stays on
    amx_w8a16: no startup fallback 'amx_w8a16 -> avx512_w8a16' (the alert
    Fp8serveKernelStartupFallback fired on one)."""
    layer = "layers.0.mlp.down_proj"
    report = KernelReport()
    report.record_choice(LayerChoice(layer, "amx_w8a16", "cpu", "per_channel", 64, 96, (),
                                     first_choice="amx_w8a16",
                                     generated_kernel_id="avx512_w8a16"))
    report.record_fallback(RuntimeFallback(layer, "avx512_w8a16", "amx_w8a16",
                                           "RuntimeError: no such shape",
                                           GENERATED_ROWS_STAGE))
    assert startup_kernels(report.snapshot())[layer] == "amx_w8a16"
    text = _scrape(report)
    assert ('fp8serve_kernel_runtime_fallbacks_total{from_kernel="avx512_w8a16",'
            'to_kernel="amx_w8a16"} 1.0') in text
    assert "fp8serve_kernel_startup_fallbacks{" not in text
    # its own kernel failing afterwards is a move off the kernel it got at load
    report.record_fallback(RuntimeFallback(layer, "amx_w8a16", "avx512_w8a16", "boom"))
    assert startup_kernels(report.snapshot())[layer] == "amx_w8a16"
    assert "fp8serve_kernel_startup_fallbacks{" not in _scrape(report)


def test_a_runtime_errors_rejection_reason_is_cut_like_a_decoder_layers():
    """A runtime fallback adds the failed kernel to the layer's rejections with the error
    as the reason: the kernel_rejections label keeps its first 160 characters, as
    decoder_layers does (a torch error's message runs to kilobytes)."""
    layer = "layers.0.mlp.down_proj"
    report = KernelReport()
    report.record_choice(LayerChoice(layer, "avx2_w8a16", "cpu", "per_tensor", 8, 8, (),
                                     first_choice="avx2_w8a16"))
    report.record_fallback(RuntimeFallback(layer, "avx2_w8a16", "torch_w8a16",
                                           "RuntimeError: " + "x" * 4000))
    (line,) = [x for x in _scrape(report).splitlines()
               if x.startswith("fp8serve_kernel_rejections{")]
    reason = line.split('reason="', 1)[1].rsplit('"}', 1)[0]
    assert reason.startswith("runtime error (apply): RuntimeError: xxx") and len(reason) == 160
    # the report keeps the whole error (GET /kernels)
    assert len(report.snapshot()["runtime_fallbacks"][0]["error"]) == 4014
