"""avx512_w8a16 against the fp32 oracle (tolerance: tests/ext/support.py), plus the
layout contracts: padding tails, N == K orientation, transposed views, layout tags."""

from __future__ import annotations

import pytest
import torch

from engine.kernels.avx512 import VNNI32_LAYOUT, Avx512W8A16
from engine.kernels.base import Fp8Spec, Fp8Weight, LayoutError, ScaleKind
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
KERNEL = Avx512W8A16()
KINDS = [ScaleKind.PER_TENSOR, ScaleKind.PER_CHANNEL]
MS = [1, 3, 4, 5, 17, 64, 128]


def _run(m, n, k, kind, with_bias, seed=0):
    w = make_weight(n, k, kind, seed)
    x, bias = make_x(m, k), make_bias(n) if with_bias else None
    packed = KERNEL.prepare(w)
    assert packed.layout == VNNI32_LAYOUT
    assert_close_to_oracle(KERNEL.apply(packed, x, bias), w, x, bias)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("with_bias", [False, True])
@pytest.mark.parametrize("n,k", [(32, 64), (48, 200), (16, 40)])
@pytest.mark.parametrize("m", MS)
def test_small_shapes_match_oracle(m, n, k, kind, with_bias):
    _run(m, n, k, kind, with_bias)


@pytest.mark.parametrize("m,n,k,kind,with_bias", [
    (1, 1024, 4096, ScaleKind.PER_TENSOR, False),
    (17, 1024, 4096, ScaleKind.PER_CHANNEL, True),
    (4, 4096, 4096, ScaleKind.PER_CHANNEL, True),
    (128, 4096, 4096, ScaleKind.PER_TENSOR, False),
])
def test_model_shapes_match_oracle(m, n, k, kind, with_bias):
    _run(m, n, k, kind, with_bias)


def test_zero_rows():
    w = make_weight(48, 64, ScaleKind.PER_CHANNEL)
    y = KERNEL.apply(KERNEL.prepare(w), make_x(0, 64))
    assert tuple(y.shape) == (0, 48)


def test_square_weight_orientation_is_never_guessed():
    # N == K: x @ W.T and x @ W have the same shape; only the layout contract tells them apart
    w = make_weight(64, 64, ScaleKind.PER_CHANNEL, seed=3)
    x = make_x(3, 64)
    y = KERNEL.apply(KERNEL.prepare(w), x)
    assert_close_to_oracle(y, w, x, None)
    wrong = (x.float() @ (w.weight.float() * w.scale[:, None]))  # the transposed product
    assert (y.float() - wrong).abs().max() > 0.1 * wrong.abs().max()
    # a transposed [K, N] view is rejected by can_implement and prepare, never computed
    wt = Fp8Weight(w.weight.t(), w.scale, ScaleKind.PER_CHANNEL)
    assert "row-major" in (KERNEL.can_implement(Fp8Spec.of(wt)) or "")
    with pytest.raises(LayoutError, match="row-major"):
        KERNEL.prepare(wt)


def test_apply_asserts_layout_tag_and_x_shape():
    w = make_weight(32, 64, ScaleKind.PER_CHANNEL)
    packed = KERNEL.prepare(w)
    bad = type(packed)(packed.kernel_id, "fp8[N,K]", packed.n, packed.k, packed.tensors,
                       packed.meta)
    with pytest.raises(LayoutError, match="expected avx512_w8a16"):
        KERNEL.apply(bad, make_x(1, 64))
    with pytest.raises(LayoutError, match=r"K=64"):
        KERNEL.apply(packed, make_x(1, 60))


def test_gate_and_registry_choice():
    zen = fake_hw(*AVX512_HOST, *AVX2_HOST)
    assert KERNEL.is_supported(zen) is None
    assert "avx512_bf16" in (KERNEL.is_supported(fake_hw(*AVX2_HOST)) or "")
    for kind in KINDS:
        assert select_kernel(Fp8Spec(n=48, k=200, scale_kind=kind), zen).kernel.id == (
            "avx512_w8a16")
    assert KERNEL.can_implement(Fp8Spec(n=48, k=200, scale_kind=ScaleKind.BLOCK))


def test_uses_torch_intra_op_threads():
    w = make_weight(256, 256, ScaleKind.PER_CHANNEL)
    x, packed = make_x(5, 256), KERNEL.prepare(w)
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = KERNEL.apply(packed, x)
    finally:
        torch.set_num_threads(n)
    assert torch.equal(one, KERNEL.apply(packed, x))  # same result whatever the split
