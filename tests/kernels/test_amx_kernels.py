"""amx_w8a16 / amx_block_w8a16 with the gate forced open by a fake AMX HardwareInfo.

This host has no AMX, so at::native::cpublas::brgemm runs oneDNN's AVX-512 kernels here;
the code path (128-deep bf16 tiles, add_C over K chunks, scales) is the one an AMX host
runs, but real AMX tile execution is NOT verified by these tests.
Tolerance: tests/ext/support.py."""

from __future__ import annotations

import pytest

from engine.kernels.amx import AmxBlockW8A16, AmxW8A16
from engine.kernels.base import Fp8Spec, ScaleKind
from engine.kernels.registry import select_kernel
from tests.ext.support import (
    AVX2_HOST,
    AVX512_HOST,
    assert_close_to_oracle,
    fake_hw,
    make_bias,
    make_weight,
    make_x,
    needs_avx512,
)

pytestmark = needs_avx512
AMX_HOST = (*AVX512_HOST, *AVX2_HOST, "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")
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


def test_per_tensor_goes_through_a_synthetic_block_scale():
    packed = DENSE.prepare(make_weight(48, 200, ScaleKind.PER_TENSOR))
    assert tuple(packed.tensors["scale"].shape) == (1, 2)
    assert packed.meta["block"] == (64, 128)


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
