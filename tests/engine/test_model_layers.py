"""RMSNorm against transformers; q/k/v and gate/up fusion (exact, no requantization)."""

from __future__ import annotations

import pytest
import torch

from engine.hardware import HardwareInfo
from engine.kernels.base import FP8_DTYPE, Fp8Weight, ScaleKind
from engine.kernels.layer_kernel import KernelReport
from engine.kernels.reference import reference_linear
from engine.kernels.registry import KernelOverrides
from engine.model.layers import (
    Bf16Linear,
    Fp8Linear,
    LinearFactory,
    fuse_fp8,
    fuse_weights,
    rms_norm,
)
from tests.engine.test_model_support import quantize_fp8


def _factory() -> LinearFactory:
    return LinearFactory(HardwareInfo.fake(), KernelOverrides(), KernelReport())


def test_rms_norm_matches_transformers_in_bf16() -> None:
    from transformers.models.ministral3.modeling_ministral3 import Ministral3RMSNorm

    x = (torch.randn(7, 48) * 3).to(torch.bfloat16)
    w = (1 + 0.3 * torch.randn(48)).to(torch.bfloat16)
    ref = Ministral3RMSNorm(48, eps=1e-5).to(torch.bfloat16)
    with torch.no_grad():
        ref.weight.copy_(w)
        expected = ref(x)
    out = rms_norm(x, w, 1e-5)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, expected)


def _shards(kind: ScaleKind, ns: tuple[int, ...], k: int = 64) -> list[Fp8Weight]:
    g = torch.Generator().manual_seed(sum(ns))
    return [quantize_fp8(torch.randn(n, k, generator=g) * (i + 1), kind, act_scale=0.01 * (i + 1))
            for i, n in enumerate(ns)]


@pytest.mark.parametrize("kind", [ScaleKind.PER_TENSOR, ScaleKind.PER_CHANNEL])
def test_fused_per_tensor_shards_become_exact_per_channel(kind: ScaleKind) -> None:
    shards = _shards(kind, (64, 32, 32))
    fused = fuse_fp8(shards)
    assert fused is not None and fused.scale_kind is ScaleKind.PER_CHANNEL
    assert fused.weight.dtype == FP8_DTYPE and fused.scale.shape == (128,)
    # rows unchanged: no requantization
    assert torch.equal(fused.weight.view(torch.uint8),
                       torch.cat([s.weight for s in shards]).view(torch.uint8))
    assert float(fused.activation_scale) == pytest.approx(0.03)  # max of the shards
    x = torch.randn(5, 64).to(torch.bfloat16)
    ref = torch.cat([reference_linear(s, x) for s in shards], dim=1)
    torch.testing.assert_close(reference_linear(fused, x), ref, rtol=0, atol=0)


def test_fused_module_output_equals_unfused_modules() -> None:
    make = _factory()
    shards = _shards(ScaleKind.PER_TENSOR, (64, 32, 32))
    fused = make.fused("l.qkv", dict(zip("qkv", shards, strict=True)))
    assert fused.is_fused and isinstance(fused.modules[0], Fp8Linear)
    x = torch.randn(3, 64).to(torch.bfloat16)
    for part, s in zip(fused(x), shards, strict=True):
        alone = make("alone", s)(x)
        torch.testing.assert_close(part.float(), alone.float(), rtol=2e-2, atol=2e-2)
        torch.testing.assert_close(part.float(), reference_linear(s, x), rtol=2e-2, atol=5e-2)
    assert "l.qkv" in make.report.choices


def test_block_scaled_shards_fuse_by_block_rows_when_aligned() -> None:
    shards = _shards(ScaleKind.BLOCK, (256, 128), k=200)
    fused = fuse_fp8(shards)
    assert fused is not None and fused.scale_kind is ScaleKind.BLOCK
    assert fused.scale.shape == (3, 2)
    x = torch.randn(2, 200).to(torch.bfloat16)
    ref = torch.cat([reference_linear(s, x) for s in shards], dim=1)
    torch.testing.assert_close(reference_linear(fused, x), ref, rtol=0, atol=0)


def test_ragged_block_shards_stay_separate() -> None:
    shards = _shards(ScaleKind.BLOCK, (192, 64), k=128)
    assert fuse_fp8(shards) is None
    make = _factory()
    fused = make.fused("l.gate_up", {"gate_proj": shards[0], "up_proj": shards[1]})
    assert not fused.is_fused and len(fused.modules) == 2
    assert {"l.gate_up.gate_proj", "l.gate_up.up_proj"} <= set(make.report.choices)
    outs = fused(torch.randn(2, 128).to(torch.bfloat16))
    assert [o.shape[1] for o in outs] == [192, 64]


def test_mixed_fp8_and_bf16_or_mixed_k_do_not_fuse() -> None:
    fp8 = _shards(ScaleKind.PER_TENSOR, (32,))[0]
    assert fuse_weights([fp8, torch.randn(32, 64).to(torch.bfloat16)]) is None
    assert fuse_fp8([fp8, _shards(ScaleKind.PER_TENSOR, (32,), k=32)[0]]) is None
    missing_act = Fp8Weight(fp8.weight, fp8.scale, fp8.scale_kind, None)
    assert fuse_fp8([fp8, missing_act]).activation_scale is None  # type: ignore[union-attr]


def test_bf16_shards_fuse_and_split_exactly() -> None:
    ws = [torch.randn(n, 16).to(torch.bfloat16) for n in (8, 4)]
    fused = _factory().fused("l.gate_up", {"gate_proj": ws[0], "up_proj": ws[1]})
    assert fused.is_fused and isinstance(fused.modules[0], Bf16Linear)
    x = torch.randn(3, 16).to(torch.bfloat16)
    for part, w in zip(fused(x), ws, strict=True):
        assert torch.equal(part, Bf16Linear("w", w)(x))
