"""Every CPU FP8 kernel of the registry on shapes no published checkpoint has: M 1, 3, 17,
40 (across the AVX-512 GEMV/panel switch at 32), N 8, 33, 200, K 16, 75 (odd), 200 and
K = 0, with block sizes that do not divide the dims (128 over 200) or are not multiples
of 32 (48). A kernel either declines the shape in ``can_implement`` (the registry then
passes it over) or computes it: within the oracle's tolerance, bias included, each row the
same alone as in the batch for a batch-invariant kernel. It never raises on a shape it
accepted. The AMX kernels run their portable stand-in where the host has no tiles. The
tolerance is the C++ kernels' (tests/ext/support.py); the torch kernels, which multiply the
dequantized weight in bf16, get test_torch_kernels.py's.
"""

from __future__ import annotations

import pytest
import torch

from engine.kernels.base import FP8_DTYPE, Fp8Spec, Fp8Weight, ScaleKind
from engine.kernels.layer_kernel import KernelReport, LayerKernel
from engine.kernels.reference import reference_linear
from engine.kernels.registry import KERNEL_CLASSES, KernelOverrides, get_kernel
from tests.ext.support import (
    AVX2_HOST,
    AVX512_HOST,
    assert_close_to_oracle,
    fake_hw,
    host_has,
    make_bias,
    make_weight,
    make_x,
)
from tests.kernels.test_torch_kernels import assert_matches

CPU_KERNELS = sorted(k for k in KERNEL_CLASSES if not k.startswith(("xpu", "cuda")))
MS, NS, KS = (1, 3, 17, 40), (8, 33, 200), (16, 75, 200)
BLOCKS = ((128, 128), (32, 64), (48, 48))
NEEDS = {"avx512": AVX512_HOST, "avx2": AVX2_HOST}


def _kernel(kernel_id: str):
    flags = NEEDS.get(kernel_id.split("_")[0], ())
    if flags and not host_has(*flags):
        pytest.skip(f"host CPU lacks {', '.join(flags)}, or FP8SERVE_ISA caps the dispatch "
                    "below it")
    return get_kernel(kernel_id)


def _weights(kind: ScaleKind, n: int, k: int):
    blocks = BLOCKS if kind is ScaleKind.BLOCK else ((128, 128),)
    for i, block in enumerate(blocks):
        w = make_weight(n, k, kind, seed=n * 1000 + k + i, block=block)
        if kind is not ScaleKind.BLOCK:
            w = Fp8Weight(w.weight, w.scale, kind, torch.tensor(0.05))  # w8a8 reads it
        yield w


@pytest.mark.parametrize("kernel_id", CPU_KERNELS)
def test_kernel_computes_or_declines_odd_shapes(kernel_id: str) -> None:
    kernel = _kernel(kernel_id)
    ran = 0
    for kind in sorted(kernel.scale_kinds, key=lambda s: s.value):
        for n in NS:
            for k in KS:
                for w in _weights(kind, n, k):
                    if kernel.can_implement(Fp8Spec.of(w, has_bias=True)) is None:
                        _check(kernel, w, n, k)
                        ran += 1
    assert ran >= len(NS) * len(KS)  # 128 x 128 blocks over any dims are taken by all


def _check(kernel, w: Fp8Weight, n: int, k: int) -> None:
    packed = kernel.prepare(w)
    bias = make_bias(n)
    for m in MS:
        x = make_x(m, k, seed=m)
        if kernel.id == "torch_scaled_mm_w8a8":  # x on the static scale's fp8 grid
            s = w.activation_scale
            x = ((x.float() / s).clamp(-448, 448).to(FP8_DTYPE).float() * s).to(torch.bfloat16)
        y = kernel.apply(packed, x, bias)
        if kernel.id.startswith("torch_"):  # bf16 matmul of the dequantized weight
            assert_matches(y, reference_linear(w, x, bias))
        else:
            assert_close_to_oracle(y, w, x, bias)
        if kernel.batch_invariant and m > 1:
            assert torch.equal(kernel.apply(packed, x[m - 1:].contiguous(), bias), y[m - 1:])


@pytest.mark.parametrize("kernel_id", CPU_KERNELS)
def test_k_zero_is_declined_or_gives_the_bias(kernel_id: str) -> None:
    """An empty reduction: y is the bias (zeros without one), or the kernel declines."""
    kernel = _kernel(kernel_id)
    for kind in kernel.scale_kinds:
        scale = {ScaleKind.BLOCK: torch.ones(1, 0), ScaleKind.PER_CHANNEL: torch.ones(24),
                 ScaleKind.PER_TENSOR: torch.tensor(0.5)}[kind]
        w = Fp8Weight(torch.zeros(24, 0, dtype=FP8_DTYPE), scale, kind, torch.tensor(0.05))
        if kernel.can_implement(Fp8Spec.of(w, has_bias=True)) is not None:
            continue
        bias = make_bias(24)
        y = kernel.apply(kernel.prepare(w), torch.zeros(3, 0, dtype=torch.bfloat16), bias)
        assert y.dtype == torch.bfloat16 and y.shape == (3, 24)
        assert torch.equal(y, bias.to(torch.bfloat16).expand(3, 24))


def test_registry_gives_a_k_zero_layer_a_kernel_that_runs_it() -> None:
    """The registry's choice for such a layer runs on its first call: no runtime
    fallback (the kernels that cannot compute it said so at selection)."""
    hw = fake_hw(*(f for f in (*AVX512_HOST, *AVX2_HOST) if host_has(f)))
    report = KernelReport()
    w = Fp8Weight(torch.zeros(24, 0, dtype=FP8_DTYPE), torch.tensor(0.5),
                  ScaleKind.PER_TENSOR)
    layer = LayerKernel("layers.0.mlp.down_proj", w, hw, KernelOverrides(), report)
    y = layer(torch.zeros(5, 0, dtype=torch.bfloat16))
    assert torch.equal(y, torch.zeros(5, 24, dtype=torch.bfloat16))
    assert report.fallbacks == [], report.fallbacks
