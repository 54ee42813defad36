"""The fusion decision (engine/model/decode_step.py) with fake hardware: layers on the
AMX kernels fuse and their op is told to call the AMX GEMM (dims[5] = GEMM_AMX), layers on
the AVX-512 kernels keep theirs, a layer mixing the two does not fuse; layers on the AVX2
kernel fuse with dims[5] = GEMM_AVX2 from dispatch level avx2 on. The dispatch level is
faked too (ext.isa), so nothing here runs the fused op: it is tested in
test_decode_step.py on each kernel family the host can execute (the AMX GEMM there runs
on the real tiles or, below dispatch level amx, on the stand-in)."""

from __future__ import annotations

import pytest

import ext
from engine.kernels.avx512 import GEMV_MAX_M, Avx512W8A16
from engine.kernels.base import ScaleKind
from engine.kernels.registry import KernelOverrides
from engine.model.decode_step import GEMM_AMX, GEMM_AVX2, fusion_reason
from engine.runner import ModelRunner
from tests.engine.test_model_support import engine_config, random_weights, tiny_config
from tests.ext.support import AMX_HOST, AVX2_HOST, AVX512_HOST, fake_hw


def _runner(monkeypatch, isa: str, flags: tuple[str, ...], amx: bool,
            kind: ScaleKind = ScaleKind.PER_TENSOR) -> ModelRunner:
    monkeypatch.setattr(ext, "isa", lambda: isa)
    weights = random_weights(tiny_config(num_layers=2), seed=9, kind=kind)
    return ModelRunner(weights, engine_config(), fake_hw(*flags, amx=amx), KernelOverrides())


@pytest.mark.parametrize("kind,kernel", [(ScaleKind.PER_TENSOR, "amx_w8a16"),
                                         (ScaleKind.PER_CHANNEL, "amx_w8a16")])
def test_amx_layers_fuse_and_call_the_amx_gemm(monkeypatch, kind, kernel):
    runner = _runner(monkeypatch, "amx", AMX_HOST, True, kind)
    model = runner.model
    assert model.fusion_reasons == [None, None]
    kernels = {c.kernel_id for c in runner.kernel_report.choices.values()
               if c.layer.startswith("layers.")}
    assert kernels == {kernel}
    assert [f.dims[5] for f in model.fused] == [GEMM_AMX, GEMM_AMX]


def test_avx512_layers_keep_the_avx512_gemm(monkeypatch):
    runner = _runner(monkeypatch, "avx512", AVX512_HOST, False)
    assert runner.model.fusion_reasons == [None, None]
    assert [f.dims[5] for f in runner.model.fused] == [GEMV_MAX_M, GEMV_MAX_M]


def test_amx_without_the_grant_fuses_on_avx512(monkeypatch):
    runner = _runner(monkeypatch, "avx512_vbmi", AMX_HOST, False)
    assert runner.model.fusion_reasons == [None, None]
    assert [f.dims[5] for f in runner.model.fused] == [GEMV_MAX_M, GEMV_MAX_M]


def test_a_layer_mixing_amx_and_avx512_linears_does_not_fuse(monkeypatch):
    runner = _runner(monkeypatch, "amx", AMX_HOST, True)
    layer = runner.model.layers[1]
    layer.o_proj.kernel.kernel = Avx512W8A16()
    why = fusion_reason(layer) or ""
    assert "mix the AMX and AVX-512 GEMMs (amx_w8a16, avx512_w8a16)" in why
    assert fusion_reason(runner.model.layers[0]) is None


def test_avx2_layers_fuse_and_call_the_avx2_gemm(monkeypatch):
    runner = _runner(monkeypatch, "avx2", AVX2_HOST, False)
    assert runner.model.fusion_reasons == [None, None]
    assert {c.kernel_id for c in runner.kernel_report.choices.values()
            if c.layer.startswith("layers.")} == {"avx2_w8a16"}
    assert [f.dims[5] for f in runner.model.fused] == [GEMM_AVX2, GEMM_AVX2]


def test_avx2_layers_below_dispatch_level_avx2_do_not_fuse(monkeypatch):
    runner = _runner(monkeypatch, "avx2", AVX2_HOST, False)
    monkeypatch.setattr(ext, "isa", lambda: "scalar")
    assert fusion_reason(runner.model.layers[0]) == (
        "dispatch ISA scalar below avx2 (its linears run avx2_w8a16)")


def test_a_linear_not_in_its_kernels_layout_does_not_fuse(monkeypatch):
    runner = _runner(monkeypatch, "avx2", AVX2_HOST, False)
    layer = runner.model.layers[0]
    layer.down_proj.kernel.kernel = Avx512W8A16()  # an avx2_16 weight on the vnni32 kernel
    assert fusion_reason(layer) == ("down_proj runs avx512_w8a16 (fp8_avx2_16[ceil(N/16)][K][16]), "
                                    "not the AVX-512, AMX or AVX2 FP8 kernel")
    assert fusion_reason(runner.model.layers[1]) is None
