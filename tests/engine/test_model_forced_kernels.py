"""The whole model with each CPU kernel forced (FP8SERVE_KERNEL) matches the model on the
pure-torch reference kernel, and every FP8 layer really ran on the forced kernel.

The AMX kernel is forced open on a fake AMX host: brgemm then runs oneDNN's AVX-512 code
on this machine (real AMX tiles are not exercised here).

Tolerance: max |logits - ref| / max |ref| < 0.03 for the W8A16 kernels (all compute
x_bf16 @ W_fp8 in fp32 accumulation; differences are bf16 rounding of the per-layer
outputs), and < 0.20 for torch_scaled_mm_w8a8, which also quantizes every activation to
FP8 with the checkpoint's static scale (3 mantissa bits, up to 6% per element, compounded
over every layer; measured 0.13). A transposed or mis-scaled weight gives errors near 1.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

import ext
from engine.batch import BatchInputs, LogitsWanted, SeqChunk
from engine.hardware import HardwareInfo
from engine.kernels.registry import KernelOverrides
from engine.runner import ModelRunner, load_runner
from tests.engine.test_model_support import engine_config, logit_error
from tests.ext.support import host_has

AVX512 = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
          "avx512_bf16")
PROMPT = torch.randint(3, 1000, (37,), generator=torch.Generator().manual_seed(11)).tolist()

# kernel id -> (host profile flags, AMX permitted, tolerance)
FORCED = {
    "amx_w8a16": (AVX512 + ("amx_tile", "amx_bf16", "amx_int8"), True, 0.03),
    "avx512_w8a16": (AVX512, False, 0.03),
    "avx2_w8a16": (("avx2", "fma", "f16c"), False, 0.03),
    "portable_w8a16": ((), False, 0.03),
    "torch_w8a16": ((), False, 0.03),
    "torch_scaled_mm_w8a8": ((), False, 0.20),
}


def _host(flags: tuple[str, ...], amx: bool) -> HardwareInfo:
    return HardwareInfo.fake(*flags, amx_permitted=amx, extension=ext.load())


def _run(path: Path, hw: HardwareInfo, overrides: KernelOverrides) -> tuple[torch.Tensor,
                                                                           ModelRunner]:
    runner = load_runner(path, engine_config(kv_block_size=16), hw=hw, overrides=overrides)
    chunk = SeqChunk(0, tuple(PROMPT), 0, (0, 1, 2), LogitsWanted.ALL)
    return runner.run(BatchInputs((chunk,))), runner


@pytest.fixture(scope="module")
def checkpoint(tiny_checkpoint) -> Path:
    return tiny_checkpoint(original_max_position_embeddings=8, seed=5)


@pytest.fixture(scope="module")
def reference(checkpoint: Path) -> torch.Tensor:
    logits, _ = _run(checkpoint, HardwareInfo.fake(), KernelOverrides(forced="torch_w8a16"))
    return logits


@pytest.mark.parametrize("kernel_id", list(FORCED))
def test_forced_kernel_runs_every_fp8_layer_and_matches_reference(
        kernel_id: str, checkpoint: Path, reference: torch.Tensor) -> None:
    flags, amx, tol = FORCED[kernel_id]
    real = tuple(f for f in flags if not f.startswith("amx"))  # AMX itself is faked open
    if not host_has(*real):
        pytest.skip(f"{kernel_id} needs {', '.join(real)} from the real CPU: the fake host "
                    "profile only opens the gate")
    if not kernel_id.startswith("torch_"):
        assert ext.load().built, f"the C++ extension must build here: {ext.load().error}"
    logits, runner = _run(checkpoint, _host(flags, amx), KernelOverrides(forced=kernel_id))
    layers = runner.kernel_report.snapshot()["layers"]
    fp8_layers = [lay for lay in layers if lay["layer"] != "lm_head"]
    assert fp8_layers, "the tiny checkpoint has FP8 layers"
    assert {lay["kernel_id"] for lay in fp8_layers} == {kernel_id}
    assert not runner.kernel_report.snapshot()["runtime_fallbacks"]
    err = logit_error(logits, reference)
    assert err < tol, f"{kernel_id}: relative logit error {err:.4f} >= {tol}"


def test_forced_kernel_the_host_cannot_run_falls_back_not_crashes(checkpoint: Path) -> None:
    """Forcing AMX on a host without it: every layer falls down the table (warning), and
    the model still runs."""
    hw = _host(AVX512, False)
    logits, runner = _run(checkpoint, hw, KernelOverrides(forced="amx_w8a16"))
    chosen = {lay["kernel_id"] for lay in runner.kernel_report.snapshot()["layers"]
              if lay["layer"] != "lm_head"}
    assert "amx_w8a16" not in chosen
    assert torch.isfinite(logits).all()
