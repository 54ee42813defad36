"""The real tables and real kernel classes on injected hardware profiles: what each host
picks per scale kind, and why the kernels above the winner were passed over."""

from __future__ import annotations

import pytest

import ext
from engine.hardware import ExtensionStatus, HardwareInfo
from engine.kernels.base import Fp8Spec, ScaleKind
from engine.kernels.registry import KernelOverrides, select_kernel
from tests.ext.support import needs_avx2, needs_avx512

BUILT = ExtensionStatus(built=True, path="/fake/fp8serve_ext.so")
AVX2 = ("avx2", "fma", "f16c")
AVX512 = AVX2 + ("avx512f", "avx512bw", "avx512vl", "avx512_vnni", "avx512_bf16")
AMX = AVX512 + ("amx_tile", "amx_bf16", "amx_int8", "amx_fp16")

PROFILES = {
    "amx": HardwareInfo.fake(*AMX, amx_permitted=True, extension=BUILT),
    "amx_not_granted": HardwareInfo.fake(*AMX, amx_permitted=False, extension=BUILT),
    "zen5": HardwareInfo.fake(*AVX512, extension=BUILT),
    "zen5_no_ext": HardwareInfo.fake(*AVX512, extension=ExtensionStatus(
        built=False, error="g++: command not found")),
    "avx2": HardwareInfo.fake(*AVX2, extension=BUILT),
    # FP8SERVE_ISA lowers the extension's dispatch: the host then chooses like a smaller one
    "amx_isa_avx512": HardwareInfo.fake(*AMX, amx_permitted=True, extension=BUILT,
                                        dispatch_isa="avx512"),
    "zen5_isa_avx2": HardwareInfo.fake(*AVX512, extension=BUILT, dispatch_isa="avx2"),
    "zen5_isa_scalar": HardwareInfo.fake(*AVX512, extension=BUILT, dispatch_isa="scalar"),
    "arm": HardwareInfo.fake(machine="aarch64", extension=BUILT),
    "xpu": HardwareInfo.fake(*AVX512, xpu_available=True, extension=BUILT),
    "cuda89": HardwareInfo.fake(*AVX512, cuda_available=True, cuda_capability=(8, 9)),
    "cuda80": HardwareInfo.fake(*AVX512, cuda_available=True, cuda_capability=(8, 0)),
}

PT, PC, BLK = ScaleKind.PER_TENSOR, ScaleKind.PER_CHANNEL, ScaleKind.BLOCK

# profile, scale kind -> (winner, [(rejected kernel, substring of its reason), ...])
EXPECTED = {
    ("amx", PT): ("amx_w8a16", []),
    ("amx", PC): ("amx_w8a16", []),
    ("amx", BLK): ("amx_block_w8a16", []),
    ("amx_not_granted", PT): ("avx512_w8a16", [("amx_w8a16", "did not grant")]),
    ("amx_not_granted", BLK): ("avx512_block_w8a16", [("amx_block_w8a16", "did not grant")]),
    ("zen5", PT): ("avx512_w8a16", [("amx_w8a16", "lacks AMX")]),
    ("zen5", PC): ("avx512_w8a16", [("amx_w8a16", "lacks AMX")]),
    ("zen5", BLK): ("avx512_block_w8a16", [("amx_block_w8a16", "lacks AMX")]),
    ("zen5_no_ext", PT): ("torch_w8a16", [("amx_w8a16", "lacks AMX"),
                                          ("avx512_w8a16", "g++: command not found"),
                                          ("avx2_w8a16", "g++: command not found"),
                                          ("portable_w8a16", "g++: command not found")]),
    ("zen5_no_ext", BLK): ("torch_block_w8a16", [
        ("amx_block_w8a16", "lacks AMX"), ("avx512_block_w8a16", "extension not built"),
        ("avx2_block_w8a16", "extension not built"),
        ("portable_block_w8a16", "extension not built")]),
    ("avx2", PT): ("avx2_w8a16", [("amx_w8a16", "lacks AMX"), ("avx512_w8a16", "avx512f")]),
    ("avx2", PC): ("avx2_w8a16", [("amx_w8a16", "lacks AMX"), ("avx512_w8a16", "avx512f")]),
    ("avx2", BLK): ("avx2_block_w8a16", [("amx_block_w8a16", "lacks AMX"),
                                         ("avx512_block_w8a16", "avx512f")]),
    ("amx_isa_avx512", PT): ("avx512_w8a16", [("amx_w8a16", "avx512 is below amx")]),
    ("amx_isa_avx512", BLK): ("avx512_block_w8a16", [("amx_block_w8a16", "below amx")]),
    ("zen5_isa_avx2", PT): ("avx2_w8a16", [("amx_w8a16", "lacks AMX"),
                                           ("avx512_w8a16", "avx2 is below avx512")]),
    ("zen5_isa_avx2", BLK): ("avx2_block_w8a16", [("amx_block_w8a16", "lacks AMX"),
                                                  ("avx512_block_w8a16", "below avx512")]),
    # below AVX2 the portable kernels: still batch-invariant
    ("zen5_isa_scalar", BLK): ("portable_block_w8a16", [
        ("amx_block_w8a16", "lacks AMX"), ("avx512_block_w8a16", "scalar is below avx512"),
        ("avx2_block_w8a16", "scalar is below avx2")]),
    ("zen5_isa_scalar", PT): ("portable_w8a16", [("amx_w8a16", "lacks AMX"),
                                              ("avx512_w8a16", "scalar is below avx512"),
                                              ("avx2_w8a16", "scalar is below avx2")]),
    ("arm", PT): ("portable_w8a16", [("amx_w8a16", "lacks AMX"), ("avx512_w8a16", "avx512f"),
                                  ("avx2_w8a16", "avx2")]),
    ("arm", BLK): ("portable_block_w8a16", [("amx_block_w8a16", "lacks AMX"),
                                         ("avx512_block_w8a16", "avx512f"),
                                         ("avx2_block_w8a16", "avx2")]),
    # no oneDNN FP8 op is registered in this torch build: the XPU torch fallback
    ("xpu", PT): ("xpu_torch_w8a16", [("xpu_w8a16", "no oneDNN FP8 GEMM op")]),
    ("xpu", PC): ("xpu_torch_w8a16", [("xpu_w8a16", "no oneDNN FP8 GEMM op")]),
    ("xpu", BLK): ("xpu_torch_w8a16", [("xpu_block_fp8", "no oneDNN FP8 GEMM op")]),
    ("cuda89", PT): ("cuda_scaled_mm_w8a8", []),
    ("cuda89", PC): ("cuda_scaled_mm_w8a8", []),
    ("cuda89", BLK): ("cuda_torch_w8a16", []),
    ("cuda80", PT): ("cuda_torch_w8a16", [("cuda_scaled_mm_w8a8", "8.0 < 8.9")]),
    ("cuda80", PC): ("cuda_torch_w8a16", [("cuda_scaled_mm_w8a8", "8.0 < 8.9")]),
}


def spec(kind: ScaleKind, act: bool = True) -> Fp8Spec:
    return Fp8Spec(4096, 4096, kind, has_activation_scale=act)


@pytest.mark.parametrize("profile,kind", sorted(EXPECTED, key=str),
                         ids=[f"{p}-{k.value}" for p, k in sorted(EXPECTED, key=str)])
def test_profile_picks_and_reasons(profile: str, kind: ScaleKind) -> None:
    winner, rejected = EXPECTED[(profile, kind)]
    sel = select_kernel(spec(kind), PROFILES[profile])
    assert sel.kernel.id == winner, [(r.kernel_id, r.reason) for r in sel.rejections]
    assert [r.kernel_id for r in sel.rejections] == [k for k, _ in rejected]
    for r, (_, why) in zip(sel.rejections, rejected, strict=True):
        assert why in r.reason, (r.kernel_id, r.reason)
    assert sel.warning is None


def test_cpu_tables_always_end_in_a_torch_kernel() -> None:
    for name, hw in PROFILES.items():
        if hw.xpu_available or hw.cuda_available:
            continue
        sel = select_kernel(spec(PT), hw)
        chain = [sel.kernel.id] + [k.id for k in sel.fallbacks]
        assert chain[-2:] == ["torch_w8a16", "torch_scaled_mm_w8a8"], (name, chain)


def test_without_activation_scale_scaled_mm_is_not_a_fallback() -> None:
    sel = select_kernel(spec(PT, act=False), PROFILES["avx2"])
    assert [k.id for k in sel.fallbacks] == ["portable_w8a16", "torch_w8a16"]
    cuda = select_kernel(spec(PT, act=False), PROFILES["cuda89"])
    assert cuda.kernel.id == "cuda_torch_w8a16"
    assert "activation_scale" in cuda.rejections[0].reason


def test_operator_can_force_the_torch_kernel_on_an_amx_host() -> None:
    sel = select_kernel(spec(PT), PROFILES["amx"], KernelOverrides(forced="torch_w8a16"))
    assert sel.kernel.id == "torch_w8a16"
    assert [k.id for k in sel.fallbacks][:3] == ["amx_w8a16", "avx512_w8a16", "avx2_w8a16"]


def test_disabling_amx_and_avx512_on_an_amx_host() -> None:
    off = KernelOverrides(disabled=frozenset({"amx_w8a16", "avx512_w8a16"}))
    sel = select_kernel(spec(PC), PROFILES["amx"], off)
    assert sel.kernel.id == "avx2_w8a16"
    assert all("disabled by operator" in r.reason for r in sel.rejections)


def test_forcing_an_avx512_kernel_on_avx2_host_falls_back_with_warning() -> None:
    sel = select_kernel(spec(PT), PROFILES["avx2"], KernelOverrides(forced="avx512_w8a16"))
    assert sel.kernel.id == "avx2_w8a16"
    assert sel.warning and "avx512_w8a16" in sel.warning and "avx512f" in sel.warning


# profile -> the cpu/bf16 table: (kernel, supported, substring of why not)
BF16 = {
    "zen5": [("bf16_avx512", True, ""), ("bf16_avx2", True, ""), ("bf16_portable", True, ""),
             ("torch_mm", True, "")],
    "avx2": [("bf16_avx512", False, "avx512f"), ("bf16_avx2", True, ""),
             ("bf16_portable", True, ""), ("torch_mm", True, "")],
    "zen5_no_ext": [("bf16_avx512", False, "g++: command not found"),
                    ("bf16_avx2", False, "g++: command not found"),
                    ("bf16_portable", False, "g++: command not found"), ("torch_mm", True, "")],
}


@pytest.mark.parametrize("profile", [
    pytest.param("zen5", marks=needs_avx512), pytest.param("avx2", marks=needs_avx2),
    "zen5_no_ext"])
def test_the_bf16_table_names_each_kernel_and_why(profile: str) -> None:
    """The bf16 linears' (the lm_head's) table in the report: priority order, which this
    host runs and why not, only torch_mm not batch-invariant; placed after the CPU FP8
    tables, active on every platform (the decoder runs on the CPU). The C++ kernels' gates
    also read the loaded extension's dispatch level, hence the real ISA each case needs."""
    from engine.kernels.report import build_kernel_report

    hw = PROFILES[profile]
    if hw.extension.built:
        hw = HardwareInfo.fake(*hw.cpu_flags, extension=ext.load())
    tables = build_kernel_report(hw)["tables"]
    names = [t["name"] for t in tables]
    at = names.index("cpu/bf16")
    assert names[at - 1] == "cpu/block" and tables[at]["active"]
    got = tables[at]["kernels"]
    assert [(e["kernel_id"], e["supported"]) for e in got] == [(k, ok) for k, ok, _ in
                                                                BF16[profile]]
    for e, (_, _, why) in zip(got, BF16[profile], strict=True):
        assert why in (e["reason"] or ""), e
        assert e["batch_invariant"] == (e["kernel_id"] != "torch_mm")
