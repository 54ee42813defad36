"""`fp8serve kernels`, the shared --kernel/--disable-kernel flags and the report dict."""

from __future__ import annotations

import argparse
import json

import pytest

import cli.kernels as kernels_cli
from cli.main import CliError
from engine.hardware import ExtensionStatus, HardwareInfo
from engine.kernels.layer_kernel import KernelReport, LayerChoice, RuntimeFallback
from engine.kernels.registry import KernelOverrides, Rejection
from engine.kernels.report import build_kernel_report

ZEN5 = HardwareInfo.fake("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                         "avx512_vnni", "avx512_bf16")


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    kernels_cli.register(p.add_subparsers())
    return p.parse_args(["kernels", *argv])


def test_shared_flags_build_overrides_and_refuse_unknown_ids() -> None:
    args = parse("--kernel", "torch_w8a16", "--disable-kernel", "avx2_w8a16,amx_w8a16",
                 "--disable-kernel", "avx512_w8a16")
    ov = kernels_cli.overrides_from_args(args, env={"FP8SERVE_KERNEL": "avx2_w8a16"})
    assert ov == KernelOverrides("torch_w8a16",
                                 frozenset({"avx2_w8a16", "amx_w8a16", "avx512_w8a16"}))
    env_only = kernels_cli.overrides_from_args(parse(), env={"FP8SERVE_KERNEL": "avx2_w8a16"})
    assert env_only.forced == "avx2_w8a16"
    with pytest.raises(CliError, match="unknown kernel id"):
        kernels_cli.overrides_from_args(parse("--kernel", "avx1024"), env={})


def _report() -> KernelReport:
    rep = KernelReport()
    why = (Rejection("amx_w8a16", "no AMX"),)
    for name in ("layers.0.qkv_proj", "layers.1.qkv_proj"):
        rep.record_choice(LayerChoice(name, "avx2_w8a16", "cpu", "per_channel", 1536, 1024, why))
    rep.record_fallback(RuntimeFallback("layers.1.qkv_proj", "avx2_w8a16", "torch_w8a16", "boom"))
    return rep


def test_report_dict_shape_and_summary() -> None:
    hw = HardwareInfo.fake("avx2", "fma", "f16c", cuda_available=False,
                           extension=ExtensionStatus(built=False, error="g++: not found"))
    rep = build_kernel_report(hw, KernelOverrides(disabled=frozenset({"avx2_w8a16"})), _report())
    text = json.dumps(rep)  # JSON-able (raises otherwise)
    assert set(rep) == {"schema", "platform", "hardware", "extension", "overrides", "tables",
                        "layers", "runtime_fallbacks", "decoder_layers", "attention",
                        "batch_invariant", "summary"}
    # no model: no attention path; a layer fell back to torch_w8a16, so exactness is off
    assert rep["attention"] is None and rep["batch_invariant"] is False
    assert rep["decoder_layers"] == [] and rep["summary"]["decoder_layers"] == []  # no model
    assert rep["platform"] == "cpu" and rep["hardware"]["features"]["avx2"] is True
    assert rep["hardware"]["cuda"] == {"available": False, "capability": None, "name": None}
    assert rep["extension"]["error"] == "g++: not found"
    assert rep["overrides"] == {"forced": None, "disabled": ["avx2_w8a16"], "forced_bf16": None,
                                "rows_by_role": None}
    names = [t["name"] for t in rep["tables"]]
    assert "cpu/per_tensor" in names and "xpu/block" in names and "cuda/per_channel" in names
    cpu_pt = next(t for t in rep["tables"] if t["name"] == "cpu/per_tensor")
    assert cpu_pt["active"] and cpu_pt["kernels"][0]["kernel_id"] == "amx_w8a16"
    assert set(cpu_pt["kernels"][0]) == {"kernel_id", "supported", "reason", "forced",
                                         "disabled", "batch_invariant",
                                         "generated_rows_kernel"}
    s = rep["summary"]
    assert s["selected"] == [
        {"kernel": "avx2_w8a16", "platform": "cpu", "scale_kind": "per_channel", "layers": 1},
        {"kernel": "torch_w8a16", "platform": "cpu", "scale_kind": "per_channel", "layers": 1}]
    assert {"kernel": "amx_w8a16", "reason": "no AMX", "layers": 2} in s["rejections"]
    assert s["runtime_fallbacks"] == [
        {"from_kernel": "avx2_w8a16", "to_kernel": "torch_w8a16", "count": 1}]
    assert rep["layers"][1]["rejections"][-1]["kernel_id"] == "avx2_w8a16"
    assert "runtime error" in text


def test_text_report_names_every_table_and_layer() -> None:
    hw = HardwareInfo.fake(machine="aarch64")
    text = kernels_cli.format_report(build_kernel_report(hw, None, _report()))
    assert "[cpu/per_tensor]  (this host)" in text and "[cuda/block]" in text
    assert "layers.1.qkv_proj [1536x1024 per_channel] -> torch_w8a16" in text
    assert "passed over amx_w8a16: no AMX" in text
    assert "runtime fallback avx2_w8a16 -> torch_w8a16: 1" in text
    assert kernels_cli.TABLE_LEGEND in text  # what ok / -- / batch-invariant mean


def test_text_report_names_the_dispatch_isa() -> None:
    hw = HardwareInfo.fake(*ZEN5.cpu_flags, dispatch_isa="avx2",
                           extension=ExtensionStatus(built=True, path="x.so"))
    text = kernels_cli.format_report(build_kernel_report(hw, None, _report()))
    assert "x.so, compiler ?); dispatch avx2 (" in text


def test_kernels_command_json_without_model(capsys) -> None:
    args = parse("--json", "--disable-kernel", "torch_scaled_mm_w8a8")
    assert kernels_cli.run(args, hw=ZEN5) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["layers"] == [] and rep["overrides"]["disabled"] == ["torch_scaled_mm_w8a8"]
    cpu = next(t for t in rep["tables"] if t["name"] == "cpu/per_tensor")
    torch_entry = next(e for e in cpu["kernels"] if e["kernel_id"] == "torch_w8a16")
    assert torch_entry["supported"] is True


def test_kernels_command_with_model_shows_per_layer_choices(tiny_checkpoint, capsys) -> None:
    model = tiny_checkpoint()
    args = parse("--model", str(model), "--json", "--kernel", "torch_w8a16")
    assert kernels_cli.run(args, hw=ZEN5) == 0
    rep = json.loads(capsys.readouterr().out)
    fp8 = [c for c in rep["layers"] if c["scale_kind"] != "bf16"]
    assert fp8, "the model's FP8 linears are listed"
    assert all(c["kernel_id"] == "torch_w8a16" for c in fp8)
    # the bf16 lm_head too, on the bf16 table's kernel (no override applies to it)
    head = [c for c in rep["layers"] if c["scale_kind"] == "bf16"]
    assert [c["layer"] for c in head] == ["lm_head"]
    table = next(t for t in rep["tables"] if t["name"] == "cpu/bf16")
    assert head[0]["kernel_id"] == next(e["kernel_id"] for e in table["kernels"]
                                        if e["supported"])
    assert sum(s["layers"] for s in rep["summary"]["selected"]) == len(rep["layers"])
    # no fused decode op calls torch_w8a16: every decoder layer is on the Python path
    decoder = rep["decoder_layers"]
    assert [d["index"] for d in decoder] == list(range(len(decoder))) and decoder
    assert all(d["path"] == "python" and "runs torch_w8a16" in d["reason"] for d in decoder)
    assert [s["layers"] for s in rep["summary"]["decoder_layers"]] == [len(decoder)]
    assert kernels_cli.run(parse("--model", str(model), "--kernel", "torch_w8a16"),
                           hw=ZEN5) == 0
    text = capsys.readouterr().out
    assert f"decoder layers: 0 of {len(decoder)} as one fused C++ op" in text
    assert f"{len(decoder)} layers on the Python path: qkv_proj runs torch_w8a16" in text


def test_kernels_command_with_missing_model_is_a_one_line_error(tmp_path) -> None:
    args = parse("--model", str(tmp_path / "nope"))
    with pytest.raises(CliError, match="not a directory"):
        kernels_cli.run(args, hw=ZEN5)


def test_kernels_command_names_fp8serve_fused_0_as_the_reason(tiny_checkpoint, capsys,
                                                              monkeypatch) -> None:
    monkeypatch.setenv("FP8SERVE_FUSED", "0")
    assert kernels_cli.run(parse("--model", str(tiny_checkpoint()), "--json"), hw=ZEN5) == 0
    decoder = json.loads(capsys.readouterr().out)["decoder_layers"]
    assert decoder and all(d["path"] == "python" and d["reason"].startswith("FP8SERVE_FUSED=0")
                           for d in decoder)
