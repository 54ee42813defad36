"""The hardware probe, every source replaced by a fake; plus one real run on this host."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from engine.hardware import CPU_FEATURES, ExtensionStatus, HardwareInfo
from engine.hardware_probe import parse_cpuinfo, probe_hardware

SAPPHIRE = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
flags\t\t: fpu sse avx2 fma f16c avx512f avx512bw avx512vl avx512_vnni avx512_bf16 \
amx_bf16 amx_tile amx_int8 avx512_fp16 amx_fp16
processor\t: 1
flags\t\t: fpu
"""
ZEN5 = "model name : AMD EPYC 9755\nflags : avx2 fma f16c avx512f avx512bw avx512vl " \
       "avx512_vnni avx512_bf16 avx512_fp16\n"
ARM = "processor : 0\nFeatures : fp asimd evtstrm aes pmull sha1 sha2 crc32 bf16\n" \
      "CPU implementer : 0x41\n"

NO_ACCEL = SimpleNamespace(cuda=SimpleNamespace(is_available=lambda: False))


def probe(text: str, machine: str = "x86_64", ext=None, torch_mod=NO_ACCEL,
          amx=lambda: True) -> HardwareInfo:
    return probe_hardware(ext=ext, cpuinfo_text=text, machine=machine, torch_mod=torch_mod,
                          amx_request=amx, num_cpus=4)


class FakeExt:
    def __init__(self, built: bool = True, features=("avx2", "fma"), amx=None) -> None:
        self.built, self.features, self.amx = built, features, amx
        if amx is not None:
            self.request_amx_permission = lambda: self.amx

    def load(self) -> ExtensionStatus:
        return ExtensionStatus(built=self.built, error=None if self.built else "g++ failed",
                               path="/x/fp8serve_ext.so" if self.built else None)

    def cpuid_features(self) -> frozenset[str]:
        return frozenset(self.features) | {"not_a_feature"}


def test_parse_cpuinfo_keeps_known_features_of_the_first_cpu() -> None:
    model, flags = parse_cpuinfo(SAPPHIRE)
    assert model == "Intel(R) Xeon(R) Platinum 8480+"
    assert flags == frozenset(CPU_FEATURES)  # avx512_fp16/fpu/sse dropped
    assert parse_cpuinfo(ARM)[1] == frozenset()
    assert parse_cpuinfo("") == ("unknown", frozenset())


def test_amx_host_with_permission_granted() -> None:
    hw = probe(SAPPHIRE)
    assert hw.amx_permitted and hw.amx_usable
    assert hw.num_cpus == 4 and hw.machine == "x86_64"
    assert not hw.extension.built and "not importable" in (hw.extension.error or "")


def test_amx_counts_only_when_granted() -> None:
    hw = probe(SAPPHIRE, amx=lambda: False)
    assert hw.has("amx_tile", "amx_bf16") and not hw.amx_permitted and not hw.amx_usable
    assert hw.feature_map()["amx_tile"] and not hw.feature_map()["amx_usable"]


def test_no_amx_flag_never_asks_for_permission() -> None:
    asked = []
    hw = probe(ZEN5, amx=lambda: asked.append(1) or True)
    assert asked == [] and not hw.amx_permitted
    assert hw.has("avx512f", "avx512_bf16") and not hw.has("amx_tile")
    assert hw.cpu_model == "AMD EPYC 9755"


def test_arm_host_has_no_x86_features() -> None:
    hw = probe(ARM, machine="aarch64", ext=FakeExt(features=("avx2",)))
    assert hw.cpu_flags == frozenset() and not hw.amx_permitted


def test_built_extension_cpuid_wins_over_cpuinfo() -> None:
    hw = probe(SAPPHIRE, ext=FakeExt(features=("avx2", "fma", "f16c")))
    assert hw.cpu_flags == {"avx2", "fma", "f16c"}
    assert hw.extension.built and hw.extension.path == "/x/fp8serve_ext.so"


def test_dispatch_level_comes_from_the_built_extension() -> None:
    ext = FakeExt(features=("avx2", "fma", "f16c", "avx512f"))
    ext.isa = lambda: "avx2"  # FP8SERVE_ISA=avx2 on an AVX-512 host
    hw = probe(SAPPHIRE, ext=ext)
    assert hw.dispatch_isa == "avx2" and hw.has("avx512f")  # features stay truthful
    assert hw.dispatch_reason("avx2") is None
    assert "avx2 is below avx512" in (hw.dispatch_reason("avx512") or "")
    assert probe(ZEN5, ext=FakeExt(built=False)).dispatch_isa is None
    assert HardwareInfo.fake("avx2").dispatch_reason("amx") is None  # unknown: no cap


def test_unbuilt_extension_falls_back_to_cpuinfo_and_keeps_the_error() -> None:
    hw = probe(ZEN5, ext=FakeExt(built=False, features=()))
    assert hw.has("avx512f") and hw.extension.error == "g++ failed"


def test_extension_amx_request_is_used_when_offered() -> None:
    feats = ("amx_tile", "amx_bf16")
    assert probe(SAPPHIRE, ext=FakeExt(features=feats, amx=True), amx=lambda: False).amx_usable
    assert not probe(SAPPHIRE, ext=FakeExt(features=feats, amx=False), amx=lambda: True) \
        .amx_permitted


def test_raising_extension_does_not_stop_the_probe() -> None:
    class Broken:
        def load(self):
            raise RuntimeError("dlopen failed")

    hw = probe(ZEN5, ext=Broken())
    assert not hw.extension.built and "dlopen failed" in (hw.extension.error or "")
    assert hw.has("avx2")


def test_xpu_and_cuda_availability() -> None:
    torch_mod = SimpleNamespace(
        xpu=SimpleNamespace(is_available=lambda: True, get_device_name=lambda i: "Arc B580"),
        cuda=SimpleNamespace(is_available=lambda: True, get_device_capability=lambda i: (8, 9),
                             get_device_name=lambda i: "L4"))
    hw = probe(ZEN5, torch_mod=torch_mod)
    assert hw.xpu_available and hw.xpu_name == "Arc B580"
    assert hw.cuda_available and hw.cuda_capability == (8, 9) and hw.cuda_name == "L4"
    bare = probe(ZEN5, torch_mod=SimpleNamespace())  # no xpu/cuda attribute at all
    assert not bare.xpu_available and not bare.cuda_available


def test_broken_accelerator_runtime_means_unavailable() -> None:
    def boom():
        raise RuntimeError("driver")

    hw = probe(ZEN5, torch_mod=SimpleNamespace(xpu=SimpleNamespace(is_available=boom),
                                               cuda=SimpleNamespace(is_available=boom)))
    assert not hw.xpu_available and not hw.cuda_available


def test_result_is_immutable() -> None:
    hw = probe(ZEN5)
    with pytest.raises(AttributeError):
        hw.amx_permitted = True  # type: ignore[misc]


def test_real_probe_on_this_host_agrees_with_proc_cpuinfo() -> None:
    hw = probe_hardware(ext=None)
    try:
        text = open("/proc/cpuinfo").read()
    except OSError:
        pytest.fail("this test expects Linux /proc/cpuinfo")
    want = parse_cpuinfo(text)[1] if hw.machine in ("x86_64", "AMD64") else frozenset()
    assert hw.cpu_flags == want
    assert hw.num_cpus >= 1
    if not hw.has("amx_tile"):
        assert not hw.amx_permitted


@pytest.mark.parametrize("value", ["avx-2", "AVX2", "avx512bw", "native"])
def test_an_isa_naming_no_dispatch_level_stops_the_probe(value, monkeypatch) -> None:
    """The extension warned and ran at the host's level: a typo went unnoticed."""
    monkeypatch.setenv("FP8SERVE_ISA", value)
    with pytest.raises(ValueError) as info:
        probe(SAPPHIRE)
    assert str(info.value) == (f"FP8SERVE_ISA={value!r}: one of scalar, avx2, avx512, "
                               "avx512_vbmi, amx (unset: this host's best level)")


@pytest.mark.parametrize("value", ["", "scalar", "avx2", "avx512", "avx512_vbmi", "amx"])
def test_every_dispatch_level_and_empty_are_taken(value, monkeypatch) -> None:
    monkeypatch.setenv("FP8SERVE_ISA", value)
    assert probe(SAPPHIRE).cpu_model == "Intel(R) Xeon(R) Platinum 8480+"


def test_the_kernels_command_names_a_bad_isa_in_one_line(monkeypatch, capsys) -> None:
    from cli.main import main

    monkeypatch.setenv("FP8SERVE_ISA", "avx-2")
    assert main(["kernels"]) == 1
    assert capsys.readouterr().err == ("fp8serve: error: FP8SERVE_ISA='avx-2': one of "
                                       "scalar, avx2, avx512, avx512_vbmi, amx (unset: this "
                                       "host's best level)\n")
