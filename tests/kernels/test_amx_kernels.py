"""amx_w8a16 / amx_block_w8a16 with the gate forced open by a fake AMX HardwareInfo.

On a host without AMX (dispatch level below amx) gemm_amx runs the kernel's walk on the
portable stand-in of the tile operations (ext/csrc/amx_gemm_standin.cpp), so these tests
check the packing, scales and walk on every host; real tile execution is checked only on
AMX hosts (tests/kernels/test_amx_gemm.py). Tolerance: tests/ext/support.py."""

from __future__ import annotations

import pytest
import torch

from engine.kernels.amx import AmxBlockW8A16, AmxW8A16
from engine.kernels.base import Fp8Spec, ScaleKind
from engine.kernels.registry import select_kernel
from tests.ext.support import (
    AMX_HOST,
    AVX512_HOST,
    assert_close_to_oracle,
    fake_hw,
    make_bias,
    make_weight,
    make_x,
)

DENSE, BLOCK = AmxW8A16(), AmxBlockW8A16()


def _check(kernel, m, n, k, kind, with_bias, seed=0):
    assert kernel.is_supported(fake_hw(*AMX_HOST, amx=True)) is None
    w = make_weight(n, k, kind, seed)
    x, bias = make_x(m, k), make_bias(n) if with_bias else None
    assert_close_to_oracle(kernel.apply(kernel.prepare(w), x, bias), w, x, bias)


@pytest.mark.parametrize("kind", [ScaleKind.PER_TENSOR, ScaleKind.PER_CHANNEL])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("n,k", [(32, 64), (48, 200), (16, 300)])
@pytest.mark.parametrize("m", [1, 3, 4, 5, 17, 64, 128])
def test_dense_scales_match_oracle(m, n, k, kind, with_bias):
    _check(DENSE, m, n, k, kind, with_bias)


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("n,k", [(32, 64), (48, 200), (160, 384)])
@pytest.mark.parametrize("m", [1, 5, 17, 128])
def test_block_scales_match_oracle(m, n, k, with_bias):
    _check(BLOCK, m, n, k, ScaleKind.BLOCK, with_bias, seed=m)


@pytest.mark.parametrize("kernel,kind,m", [
    (DENSE, ScaleKind.PER_TENSOR, 64),
    (DENSE, ScaleKind.PER_CHANNEL, 3),
    (BLOCK, ScaleKind.BLOCK, 17),
])
def test_model_shapes_match_oracle(kernel, kind, m):
    _check(kernel, m, 1024, 4096, kind, True)


def test_per_tensor_scale_is_broadcast_per_channel():
    w = make_weight(48, 200, ScaleKind.PER_TENSOR)
    packed = DENSE.prepare(w)
    assert packed.layout == "fp8_vnni32[ceil(N/32)][ceil(K/32)*16][32][2]"
    assert tuple(packed.tensors["weight"].shape) == (2, 112, 32, 2)
    assert torch.equal(packed.tensors["scale"], w.scale.expand(48))
    assert packed.meta["block"] == (0, 0)


def test_gate_needs_granted_amx_and_registry_prefers_it():
    assert "did not grant" in (DENSE.is_supported(fake_hw(*AMX_HOST, amx=False)) or "")
    assert "lacks AMX" in (DENSE.is_supported(fake_hw(*AVX512_HOST, amx=True)) or "")
    host = fake_hw(*AMX_HOST, amx=True)
    for kind, want in ((ScaleKind.PER_CHANNEL, "amx_w8a16"),
                       (ScaleKind.PER_TENSOR, "amx_w8a16"),
                       (ScaleKind.BLOCK, "amx_block_w8a16")):
        assert select_kernel(Fp8Spec(n=16, k=64, scale_kind=kind), host).kernel.id == want
    no_grant = select_kernel(Fp8Spec(n=16, k=64, scale_kind=ScaleKind.PER_CHANNEL),
                             fake_hw(*AMX_HOST, amx=False))
    assert no_grant.kernel.id == "avx512_w8a16"
