"""Batch invariance of avx2_w8a16 (hosts without AVX-512): row r of y is bitwise the same
alone (M = 1) or inside any batch, whatever its position in the kernel's row groups
(the same cancelling-bias sensitivity as tests/kernels/test_batch_invariance.py)."""

from __future__ import annotations

import pytest

from engine.kernels.avx2 import Avx2W8A16
from engine.kernels.base import ScaleKind
from tests.ext.support import assert_close_to_oracle, make_bias, make_weight, needs_avx2
from tests.kernels.test_batch_invariance import _assert_invariant, _dequant, _x

pytestmark = needs_avx2
N, K = 200, 417  # ragged N (13 tiles of 16, the last partial), odd K: the k tail runs


@pytest.mark.parametrize("kind", [ScaleKind.PER_TENSOR, ScaleKind.PER_CHANNEL])
def test_avx2_row_is_bitwise_batch_invariant(kind):
    kernel = Avx2W8A16()
    w = make_weight(N, K, kind, seed=3)
    packed = kernel.prepare(w)
    _assert_invariant(lambda x, b: kernel.apply(packed, x, b), _dequant(w),
                      [2, 3, 4, 5, 6, 7, 16, 33, 130])
    x = _x(37, K, seed=5)
    bias = make_bias(N)
    assert_close_to_oracle(kernel.apply(packed, x, bias), w, x, bias)
