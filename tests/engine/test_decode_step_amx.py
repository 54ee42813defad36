"""The fusion decision on AMX hosts (engine/model/decode_step.py) with fake hardware:
layers on the AMX kernels fuse and their op is told to call the AMX GEMM (dims[5] =
GEMM_AMX), layers on the AVX-512 kernels keep theirs, and a layer mixing the two does not
fuse. The dispatch level is faked too (ext.isa), so nothing here runs the fused op: the
op itself needs AVX-512 and is tested in test_decode_step.py (AVX-512 hosts; the AMX GEMM
there runs on the real tiles or, below dispatch level amx, on the stand-in)."""

from __future__ import annotations

import pytest

import ext
from engine.kernels.avx512 import GEMV_MAX_M, Avx512W8A16
from engine.kernels.base import ScaleKind
from engine.kernels.registry import KernelOverrides
from engine.model.decode_step import GEMM_AMX, fusion_reason
from engine.runner import ModelRunner
from tests.engine.test_model_support import engine_config, random_weights, tiny_config
from tests.ext.support import AVX2_HOST, AVX512_HOST, fake_hw

AMX_HOST = (*AVX512_HOST, *AVX2_HOST, "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")


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
