"""The dynamic tile split of the AVX-512 GEMMs (ext/csrc/tile_sched.h): threads claim
chunks of 32-column tiles from an atomic counter, so which thread computes a tile varies
from call to call. The output must not: every tile written exactly once with the same
bits for any thread count, chunk size (it follows N and the thread count) and M (the
M = 1 path claims single tiles, the others tile pairs). Ns cover one partial tile, odd
tile counts, chunks of 1, 2 and several tiles, and the 32-tile cap (bf16, N = 49152)."""

from __future__ import annotations

import pytest
import torch

from engine.kernels.avx512 import Avx512W8A16
from engine.kernels.base import ScaleKind
from engine.kernels.bf16_linear import Bf16Gemm
from tests.ext.support import make_weight, needs_avx512

pytestmark = needs_avx512
THREADS = (1, 2, 3, 5)


def _x(m: int, k: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g).bfloat16()


def _per_thread_count(fn) -> list[torch.Tensor]:
    n = torch.get_num_threads()
    try:
        out = []
        for t in THREADS:
            torch.set_num_threads(t)
            out.append(fn())
        return out
    finally:
        torch.set_num_threads(n)


@pytest.mark.parametrize("n", [20, 576, 1000, 3072])
@pytest.mark.parametrize("m", [1, 3, 40])
def test_fp8_gemm_same_bits_for_any_thread_count(n: int, m: int) -> None:
    w = make_weight(n, 576, ScaleKind.PER_CHANNEL, seed=n)
    kernel = Avx512W8A16()
    packed, x = kernel.prepare(w), _x(m, 576, seed=m)
    ys = _per_thread_count(lambda: kernel.apply(packed, x))
    ref = x.float() @ (w.weight.float() * w.scale.reshape(-1, 1)).t()
    err = (ys[0].float() - ref).abs()
    assert (err <= 2**-6 * ref.abs() + 2**-6 * ref.pow(2).mean().sqrt()).all()
    for t, y in zip(THREADS[1:], ys[1:], strict=True):
        assert torch.equal(y, ys[0]), f"{t} threads differ from 1"


@pytest.mark.parametrize("n", [1000, 49152])
@pytest.mark.parametrize("m", [1, 4])
def test_bf16_gemm_same_bits_for_any_thread_count(n: int, m: int) -> None:
    g = torch.Generator().manual_seed(3)
    w = (torch.randn(n, 576, generator=g) * 0.05).bfloat16()
    gemm, x = Bf16Gemm.prepare(w), _x(m, 576, seed=5)
    ys = _per_thread_count(lambda: gemm(x, out_fp32=True))
    ref = x.float() @ w.float().t()
    assert ((ys[0] - ref).abs() <= 1e-3 * ref.abs().max()).all()
    for t, y in zip(THREADS[1:], ys[1:], strict=True):
        assert torch.equal(y, ys[0]), f"{t} threads differ from 1"
