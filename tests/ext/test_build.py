"""Extension build/load, cpuid probe, ISA dispatch override, fake impls, build failure."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import ext
from engine.hardware import CPU_FEATURES, DISPATCH_LEVELS, HardwareInfo
from engine.kernels.base import Fp8Spec, ScaleKind
from engine.kernels.registry import select_kernel
from ext.build import BuildConfig, build, default_build_dir, source_hash
from ext.cpu import cpuinfo_flags
from tests.ext.support import AVX512_HOST, loaded_status

REPO = Path(__file__).resolve().parents[2]


def test_load_builds_and_registers_ops():
    st = loaded_status()
    assert st.path and Path(st.path).exists()
    assert st.torch_version == torch.__version__
    assert ext.load() is st  # once per process
    assert hasattr(torch.ops.fp8serve, "gemm_avx512")


def test_cpuid_features_match_linux_cpuinfo():
    feats = ext.cpuid_features()
    assert feats <= set(CPU_FEATURES)
    if Path("/proc/cpuinfo").exists():
        assert feats == cpuinfo_flags()


def test_dispatch_isa_follows_features():
    feats = ext.cpuid_features()
    want = "avx512" if set(AVX512_HOST) <= feats else ("avx2" if "avx2" in feats else "scalar")
    cpuinfo = Path("/proc/cpuinfo")
    linux_flags = cpuinfo.read_text().split() if cpuinfo.exists() else []
    if want == "avx512" and "avx512vbmi" in linux_flags:
        want = "avx512_vbmi"
    if want == "avx512_vbmi" and {"amx_tile", "amx_bf16"} <= feats:
        want = "amx"  # the amx level is above avx512_vbmi: its FP8 unpack is the VBMI table
    cap = os.environ.get("FP8SERVE_ISA", "")
    if cap in DISPATCH_LEVELS and DISPATCH_LEVELS.index(cap) < DISPATCH_LEVELS.index(want):
        want = cap  # a lower level caps the dispatch; a higher one is ignored
    assert ext.isa() == want


def test_team_profile_build_compiles():
    """The diagnostic build's timers (-DFP8S_TEAM_PROFILE=1, ext/csrc/team_profile.h)
    compile; the default build compiles them out."""
    from torch.utils.cpp_extension import include_paths

    src = REPO / "ext" / "csrc" / "decode_team.cpp"
    flags = [f"-I{p}" for p in include_paths()] + ["-std=c++17", "-fopenmp", "-fsyntax-only"]
    for define in ("-DFP8S_TEAM_PROFILE=1", "-DFP8S_TEAM_PROFILE=0"):
        done = subprocess.run(["c++", *flags, define, str(src)], capture_output=True, text=True)
        assert done.returncode == 0, (define, done.stderr[-2000:])


def test_amx_permission_is_false_without_amx():
    granted = ext.request_amx_permission()
    assert isinstance(granted, bool)
    if "amx_tile" not in ext.cpuid_features():
        assert granted is False


def test_build_dir_is_keyed_by_torch_version_and_sources(tmp_path):
    a, b = BuildConfig(), BuildConfig(extra_cflags=("-DX=1",))
    assert source_hash(a) != source_hash(b)
    assert default_build_dir(a).name == f"{torch.__version__}-{source_hash(a)}"
    env = BuildConfig.from_env({"FP8SERVE_EXT_DIR": str(tmp_path), "FP8SERVE_EXT_CFLAGS": "-g -O1"})
    assert env.build_dir == tmp_path and env.extra_cflags == ("-g", "-O1")


def test_broken_source_reports_compiler_error_and_registry_falls_back(tmp_path):
    bad = tmp_path / "broken.cpp"
    bad.write_text('#error "fp8serve-broken-source-marker"\n')
    st = build(BuildConfig(sources=(bad,), build_dir=tmp_path / "build"))
    assert not st.built
    assert "fp8serve-broken-source-marker" in (st.error or "")
    hw = HardwareInfo.fake(*AVX512_HOST, "avx2", "fma", "f16c", "amx_tile", "amx_bf16",
                           amx_permitted=True, extension=st)
    for kind, torch_id in ((ScaleKind.PER_CHANNEL, "torch_w8a16"),
                           (ScaleKind.BLOCK, "torch_block_w8a16")):
        sel = select_kernel(Fp8Spec(n=64, k=64, scale_kind=kind), hw)
        assert sel.kernel.id == torch_id
        assert sel.rejections, "the C++ kernels must be rejected"
        for rej in sel.rejections:
            assert "fp8serve-broken-source-marker" in rej.reason, rej


def test_bad_compiler_flag_fails_fast_with_message(tmp_path):
    st = build(BuildConfig(extra_cflags=("-fno-such-fp8serve-flag",), build_dir=tmp_path))
    assert not st.built and "no-such-fp8serve-flag" in (st.error or "")


def test_fake_impls_give_shapes_and_name_layouts():
    loaded_status()
    with FakeTensorMode():
        x = torch.empty(3, 200, dtype=torch.bfloat16)
        wp = torch.empty(2, 112, 32, 2, dtype=torch.float8_e4m3fn)
        y = torch.ops.fp8serve.gemm_avx512(x, wp, torch.empty(48), None, 48)
        assert tuple(y.shape) == (3, 48) and y.dtype == torch.bfloat16
        bad = torch.empty(2, 100, 32, 2, dtype=torch.float8_e4m3fn)
        with pytest.raises(Exception, match=r"\[N/32, K/2, 32, 2\]"):
            torch.ops.fp8serve.gemm_amx(x, bad, torch.empty(48), None, 48)
        w = torch.empty(48, 200, dtype=torch.float8_e4m3fn)
        assert tuple(torch.ops.fp8serve.pack_vnni32(w).shape) == (2, 112, 32, 2)
        assert tuple(torch.ops.fp8serve.pack_avx2(w).shape) == (3, 200, 16)


_FORCED = """
import torch, ext
from tests.ext.support import all_codes_weight
assert ext.load().built
print(ext.isa())
codes = torch.arange(256, dtype=torch.uint8).view(torch.float8_e4m3fn)
ok = (torch.arange(256) & 0x7F) != 0x7F
same = ext.fp8_to_bf16(codes).view(torch.int16) == codes.to(torch.bfloat16).view(torch.int16)
print(bool(same[ok].all()))
w, values = all_codes_weight()
try:
    exact = True
    for m, gemv_max_m in ((1, 32), (9, 0)):  # GEMV and brgemm panel paths
        x = torch.zeros(m, 32, dtype=torch.bfloat16)
        x[torch.arange(m), torch.arange(m)] = 1.0
        y = ext.gemm_avx512(x, ext.pack_vnni32(w), torch.ones(256), None, 256,
                            gemv_max_m=gemv_max_m)
        col = (torch.arange(256) % 32)[None, :] == torch.arange(m)[:, None]
        exact &= torch.equal(y.float(), torch.where(col, values.float(), torch.zeros(())))
    print("exact" if exact else "wrong")
except RuntimeError as exc:
    print("refused" if "needs AVX-512" in str(exc) else exc)
"""


@pytest.mark.parametrize("isa,gemm", [("avx512", "exact"), ("avx2", "refused"),
                                      ("scalar", "refused")])
def test_forced_isa_override(isa, gemm):
    """FP8SERVE_ISA lowers the dispatch level: avx512 forces the shift-and-fix-up FP8
    decode instead of the VBMI tables; below AVX-512 the GEMM ops refuse to run."""
    if isa == "avx512" and not set(AVX512_HOST) <= ext.cpuid_features():
        pytest.skip("host lacks AVX-512 BF16")
    loaded_status()  # the child reuses this process's build directory
    env = dict(os.environ, FP8SERVE_ISA=isa, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", _FORCED], env=env, capture_output=True,
                         text=True, timeout=300, cwd=REPO)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-3:] == [isa, "True", gemm], out.stdout


def _build_ext_parser():
    import argparse

    import cli.build_ext

    parser = argparse.ArgumentParser(prog="fp8serve")
    cli.build_ext.register(parser.add_subparsers(dest="command", required=True))
    return parser


def test_cli_build_ext(capsys):
    args = _build_ext_parser().parse_args(["build-ext"])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert "built " in out and "dispatch ISA: " in out


_CLI_FAIL = """
import sys
from cli.main import CliError
from tests.ext.test_build import _build_ext_parser
args = _build_ext_parser().parse_args(["build-ext", "--build-dir", sys.argv[1]])
try:
    args.func(args)
except CliError as exc:
    print(exc)
    sys.exit(exc.exit_code)
"""


def test_cli_build_ext_failure_is_a_cli_error(tmp_path):
    env = dict(os.environ, FP8SERVE_EXT_CFLAGS="-fno-such-fp8serve-flag", PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", _CLI_FAIL, str(tmp_path)], env=env,
                         capture_output=True, text=True, timeout=300, cwd=REPO)
    assert out.returncode == 1, out.stderr[-2000:]
    assert "extension build failed" in out.stdout
    assert "no-such-fp8serve-flag" in out.stdout


def test_stale_build_lock_is_removed_fresh_one_kept(tmp_path):
    """A lock left by a build whose process died would make cpp_extension.load wait
    forever; one older than any build is removed, a recent one (a live build) is kept."""
    import os
    import time

    from ext.build import STALE_LOCK_SECONDS, _remove_stale_lock

    lock = tmp_path / "lock"
    lock.write_text("")
    _remove_stale_lock(tmp_path)
    assert lock.exists()
    old = time.time() - STALE_LOCK_SECONDS - 60
    os.utime(lock, (old, old))
    _remove_stale_lock(tmp_path)
    assert not lock.exists()
    _remove_stale_lock(tmp_path)  # no lock: nothing to do


def test_builds_use_this_interpreters_ninja(monkeypatch) -> None:
    """Whatever PATH a process starts with, the build runs the venv's ninja (one
    .ninja_log format for the shared build directory), and PATH is restored after."""
    import shutil

    from ext.build import _one_ninja

    venv_ninja = Path(sys.executable).parent / "ninja"
    monkeypatch.setenv("PATH", "/usr/bin:/bin")
    with _one_ninja():
        found = shutil.which("ninja")
    assert os.environ["PATH"] == "/usr/bin:/bin"
    if venv_ninja.is_file():
        assert found == str(venv_ninja)
    else:  # no pip ninja beside this interpreter: PATH is left alone
        assert found == shutil.which("ninja")
