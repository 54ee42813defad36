"""avx512_block_w8a16 against the fp32 oracle with 128x128 block scales (tolerance in
tests/ext/support.py), and rejection of block sizes it cannot tile."""

from __future__ import annotations

import pytest

from engine.kernels.avx512 import Avx512BlockW8A16
from engine.kernels.base import Fp8Spec, ScaleKind
from engine.kernels.registry import select_kernel
from tests.ext.support import (
    AVX512_HOST,
    assert_close_to_oracle,
    fake_hw,
    make_bias,
    make_weight,
    make_x,
    needs_avx512,
)

pytestmark = needs_avx512
KERNEL = Avx512BlockW8A16()


@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("n,k", [(32, 64), (48, 200), (160, 384)])
@pytest.mark.parametrize("m", [1, 3, 4, 5, 17, 64, 128])
def test_block_scales_match_oracle(m, n, k, with_bias):
    w = make_weight(n, k, ScaleKind.BLOCK, seed=m)
    x, bias = make_x(m, k), make_bias(n) if with_bias else None
    assert_close_to_oracle(KERNEL.apply(KERNEL.prepare(w), x, bias), w, x, bias)


@pytest.mark.parametrize("m", [1, 128])
def test_model_shape_matches_oracle(m):
    w = make_weight(1024, 4096, ScaleKind.BLOCK, seed=7)
    x, bias = make_x(m, 4096), make_bias(1024)
    assert_close_to_oracle(KERNEL.apply(KERNEL.prepare(w), x, bias), w, x, bias)


def test_other_block_size_multiple_of_32():
    w = make_weight(96, 160, ScaleKind.BLOCK, block=(64, 32))
    x = make_x(9, 160)
    assert_close_to_oracle(KERNEL.apply(KERNEL.prepare(w), x), w, x, None)


def test_untileable_block_size_is_rejected_and_registry_falls_back():
    spec = Fp8Spec(n=96, k=256, scale_kind=ScaleKind.BLOCK, block_size=(48, 128))
    assert "multiple of (32, 32)" in (KERNEL.can_implement(spec) or "")
    sel = select_kernel(spec, fake_hw(*AVX512_HOST))
    assert sel.kernel.id == "torch_block_w8a16"
    assert any(r.kernel_id == "avx512_block_w8a16" for r in sel.rejections)
    ok = Fp8Spec(n=48, k=200, scale_kind=ScaleKind.BLOCK)
    assert select_kernel(ok, fake_hw(*AVX512_HOST)).kernel.id == "avx512_block_w8a16"
