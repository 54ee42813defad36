"""avx2_w8a16 against the fp32 oracle (tolerance: tests/ext/support.py) and its gate."""

from __future__ import annotations

import pytest

from engine.kernels.avx2 import AVX2_LAYOUT, Avx2W8A16
from engine.kernels.base import Fp8Spec, Fp8Weight, LayoutError, ScaleKind
from engine.kernels.registry import select_kernel
from tests.ext.support import (
    AVX2_HOST,
    assert_close_to_oracle,
    fake_hw,
    make_bias,
    make_weight,
    make_x,
    needs_avx2,
)

pytestmark = needs_avx2
KERNEL = Avx2W8A16()


@pytest.mark.parametrize("kind", [ScaleKind.PER_TENSOR, ScaleKind.PER_CHANNEL])
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("n,k", [(32, 64), (48, 200), (16, 33)])
@pytest.mark.parametrize("m", [1, 3, 4, 5, 17, 64, 128])
def test_small_shapes_match_oracle(m, n, k, kind, with_bias):
    w = make_weight(n, k, kind)
    x, bias = make_x(m, k), make_bias(n) if with_bias else None
    packed = KERNEL.prepare(w)
    assert packed.layout == AVX2_LAYOUT
    assert_close_to_oracle(KERNEL.apply(packed, x, bias), w, x, bias)


@pytest.mark.parametrize("m,n", [(1, 4096), (17, 1024)])
def test_model_shapes_match_oracle(m, n):
    w = make_weight(n, 4096, ScaleKind.PER_CHANNEL)
    x, bias = make_x(m, 4096), make_bias(n)
    assert_close_to_oracle(KERNEL.apply(KERNEL.prepare(w), x, bias), w, x, bias)


def test_transposed_view_rejected():
    w = make_weight(64, 64, ScaleKind.PER_TENSOR)
    wt = Fp8Weight(w.weight.t(), w.scale, ScaleKind.PER_TENSOR)
    assert KERNEL.can_implement(Fp8Spec.of(wt))
    with pytest.raises(LayoutError):
        KERNEL.prepare(wt)


def test_gate_and_registry_on_avx2_only_host():
    host = fake_hw(*AVX2_HOST)
    assert KERNEL.is_supported(host) is None
    assert "f16c" in (KERNEL.is_supported(fake_hw("avx2", "fma")) or "")
    assert KERNEL.can_implement(Fp8Spec(n=32, k=64, scale_kind=ScaleKind.BLOCK))
    spec = Fp8Spec(n=48, k=200, scale_kind=ScaleKind.PER_CHANNEL)
    assert select_kernel(spec, host).kernel.id == "avx2_w8a16"
