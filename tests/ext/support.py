"""Shared helpers for the extension and C++ kernel tests.

Tolerance used by every kernel-vs-oracle comparison (``assert_close_to_oracle``):
    |y - ref| <= 2^-7 * |ref| + 2^-7 * rms(ref)
where ref is the fp32 oracle (engine/kernels/reference.py) on the same bf16 x. The kernel
error sources are: bf16 rounding of the output (<= 2^-9 relative), fp32 accumulation in a
different order, and for block-scaled brgemm paths the bf16 rounding of w * s (2^-9
relative per weight, averaging out over K). The bound leaves ~4x margin over the
2^-9 * |ref| rounding and fails on any layout/orientation/scale mistake, which produce
errors of the order of rms(ref).
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

import ext
from engine.hardware import DISPATCH_LEVELS, HardwareInfo
from engine.kernels.base import FP8_DTYPE, Fp8Weight, ScaleKind
from engine.kernels.reference import reference_linear

AVX512_HOST = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16")
AVX2_HOST = ("avx2", "fma", "f16c")
# an AMX host's cpuid flags (fake_hw(*AMX_HOST, amx=True) also grants the tiles)
AMX_HOST = (*AVX512_HOST, *AVX2_HOST, "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")
TOL = 2.0**-7


def loaded_status():
    st = ext.load()
    assert st.built, f"extension failed to build: {st.error}"
    return st


# FP8SERVE_ISA may cap the dispatch (DISPATCH_LEVELS) below what the CPU has; the suite
# then runs as on a host of that level (FP8SERVE_ISA=avx2 on an AVX-512 machine: what an
# AVX2 host runs, and skips the rest as that host would).
def flag_level(flag: str) -> str:
    """The dispatch level that executes a cpuid flag's instructions."""
    if flag.startswith("amx"):
        return "amx"
    if flag.startswith("avx512"):
        return "avx512_vbmi" if flag.startswith("avx512_vbmi") else "avx512"
    return "avx2"


def host_has(*flags: str) -> bool:
    """The CPU has every flag and the dispatch level (FP8SERVE_ISA) reaches them."""
    if not all(f in ext.cpuid_features() for f in flags):
        return False
    top = (DISPATCH_LEVELS.index(ext.isa()) if ext.load().built
           else len(DISPATCH_LEVELS) - 1)
    return all(DISPATCH_LEVELS.index(flag_level(f)) <= top for f in flags)


needs_avx512 = pytest.mark.skipif(
    not host_has(*AVX512_HOST),
    reason="host CPU lacks AVX-512 BF16, or FP8SERVE_ISA caps the dispatch below it")
needs_avx2 = pytest.mark.skipif(
    not host_has(*AVX2_HOST), reason="host CPU lacks AVX2/FMA/F16C, or FP8SERVE_ISA caps "
    "the dispatch below it")


def fake_hw(*flags: str, amx: bool = False) -> HardwareInfo:
    """A profile with the real extension status and the given cpuid flags."""
    return HardwareInfo.fake(*flags, amx_permitted=amx, extension=loaded_status())


def make_weight(n: int, k: int, kind: ScaleKind, seed: int = 0,
                block: tuple[int, int] = (128, 128)) -> Fp8Weight:
    g = torch.Generator().manual_seed(seed)
    w = (torch.randn(n, k, generator=g) * 64).clamp(-448, 448).to(FP8_DTYPE)
    if kind is ScaleKind.PER_TENSOR:
        s = torch.tensor(0.01 + torch.rand((), generator=g).item() * 0.02)
    elif kind is ScaleKind.PER_CHANNEL:
        s = 0.005 + torch.rand(n, generator=g) * 0.03
    else:
        s = 0.005 + torch.rand(math.ceil(n / block[0]), math.ceil(k / block[1]), generator=g) * 0.03
    return Fp8Weight(w, s.float(), kind, block_size=block)


def make_x(m: int, k: int, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g).to(torch.bfloat16)


def make_bias(n: int, seed: int = 2) -> torch.Tensor:
    return torch.randn(n, generator=torch.Generator().manual_seed(seed))


def assert_close_to_oracle(y: torch.Tensor, w: Fp8Weight, x: torch.Tensor,
                           bias: torch.Tensor | None) -> None:
    ref = reference_linear(w, x, bias)
    assert y.dtype == torch.bfloat16 and tuple(y.shape) == tuple(ref.shape)
    if ref.numel() == 0:
        return
    rms = ref.pow(2).mean().sqrt().item()
    err = (y.float() - ref).abs()
    bound = TOL * ref.abs() + TOL * rms
    worst = (err - bound).max().item()
    assert worst <= 0, (f"max err {err.max().item():.4g} exceeds bound "
                        f"(rms(ref) {rms:.4g}) by {worst:.4g}")


def all_codes_weight(n_rows: int = 256, k: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """w[256, k] whose row c holds code c in column c % k (NaN codes 0x7F/0xFF -> 0);
    returns (w fp8, exact bf16 value of each row's code)."""
    codes = torch.arange(n_rows, dtype=torch.int64)
    codes[(codes & 0x7F) == 0x7F] = 0
    w8 = torch.zeros(n_rows, k, dtype=torch.uint8)
    w8[torch.arange(n_rows), codes % k] = codes.to(torch.uint8)
    w = w8.view(FP8_DTYPE)
    return w, codes.to(torch.uint8).view(FP8_DTYPE).to(torch.bfloat16)


def run_with_isa(isa: str, script: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """Python ``script`` in a new process with FP8SERVE_ISA=isa (the dispatch level is
    chosen once per process), from the current directory; its output captured as text."""
    env = {**os.environ, "FP8SERVE_ISA": isa}
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                          text=True, timeout=timeout, cwd=os.getcwd())


def run_forced_avx2(script: str) -> None:
    """Python ``script``, which prints "avx2 ok" last, in a new process under
    FP8SERVE_ISA=avx2: the AVX2 loops a host above AVX2 never runs in-process. Skips where
    the CPU lacks AVX2 (hardware) or the dispatch already is avx2 (the in-process tests
    run those loops there)."""
    if not all(f in ext.cpuid_features() for f in AVX2_HOST):
        pytest.skip("host CPU lacks AVX2/FMA/F16C")
    if ext.isa() == "avx2":
        pytest.skip("dispatch is avx2: the in-process tests already cover it")
    out = run_with_isa("avx2", script)
    assert out.returncode == 0 and "avx2 ok" in out.stdout, out.stderr[-3000:]


def assert_tests_pass_under_isa(isa: str, module: str, *tests: str) -> None:
    """Calls ``module``'s test functions ``tests`` (each given torch.ops.fp8serve) in a new
    process with FP8SERVE_ISA=isa, after checking the process dispatches at that level."""
    calls = "\n".join(f"t.{name}(torch.ops.fp8serve)" for name in tests)
    script = (f"import torch, ext\nimport {module} as t\n"
              f"assert ext.isa() == {isa!r}, ext.isa()\n{calls}\nprint('isa ok')\n")
    out = run_with_isa(isa, script)
    assert out.returncode == 0 and "isa ok" in out.stdout, out.stderr[-2000:]
