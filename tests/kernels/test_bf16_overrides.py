"""The operator's overrides on the bf16 linears' table (lm_head, unquantized linears):
--kernel / FP8SERVE_KERNEL force one of bf16_avx512, bf16_avx2, bf16_portable or torch_mm
(beside at most one FP8 kernel), --disable-kernel takes them out, and the report, the
startup choice and the exactness line all say so."""

from __future__ import annotations

import pytest
import torch

from engine.kernels.bf16_linear import (
    AVX2_KERNEL_ID,
    FORCED_TORCH_REASON,
    KERNEL_ID,
    PORTABLE_KERNEL_ID,
    TORCH_KERNEL_ID,
    Bf16Gemm,
    bf16_choice,
)
from engine.kernels.layer_kernel import KernelReport, exactness_warning
from engine.kernels.registry import DISABLED_REASON, KernelOverrides, NoKernelError, overrides_from
from engine.kernels.report import build_kernel_report
from engine.model.layers import LinearFactory
from tests.ext.support import AVX2_HOST, AVX512_HOST, fake_hw, needs_avx2
from tests.kernels.test_batch_invariance import _x
from tests.kernels.test_bf16_gemm import _w

# a profile on which every C++ bf16 kernel opens (the real CPU must run what a test calls)
ALL = (*AVX512_HOST, *AVX2_HOST)


def test_kernel_flag_splits_into_an_fp8_and_a_bf16_kernel() -> None:
    ov = overrides_from("avx2_w8a16, bf16_portable", None, env={})
    assert (ov.forced, ov.forced_bf16) == ("avx2_w8a16", "bf16_portable")
    ov = overrides_from(None, None, env={"FP8SERVE_KERNEL": "torch_mm"})
    assert (ov.forced, ov.forced_bf16) == (None, "torch_mm")
    assert overrides_from(None, "bf16_avx512", env={}).disabled == {"bf16_avx512"}
    assert ov.to_dict() == {"forced": None, "disabled": [], "forced_bf16": "torch_mm",
                            "rows_by_role": None}
    with pytest.raises(ValueError, match="--kernel bf16_avx2,torch_mm: at most one FP8"):
        overrides_from("bf16_avx2,torch_mm", None, env={})
    with pytest.raises(ValueError, match="FP8SERVE_KERNEL=avx2_w8a16,torch_w8a16: at most"):
        overrides_from(None, None, env={"FP8SERVE_KERNEL": "avx2_w8a16,torch_w8a16"})
    with pytest.raises(ValueError, match="unknown kernel id"):
        overrides_from("bf16_avx1024", None, env={})
    with pytest.raises(ValueError, match="forced_bf16"):
        KernelOverrides(forced="bf16_avx2")


def test_forced_and_disabled_bf16_kernels_pick_the_choice() -> None:
    hw = fake_hw(*ALL)
    assert bf16_choice(hw).kernel_id == KERNEL_ID
    forced = bf16_choice(hw, KernelOverrides(forced_bf16=PORTABLE_KERNEL_ID))
    assert (forced.kernel_id, forced.passed, forced.warning, forced.first) == (
        PORTABLE_KERNEL_ID, (), None, PORTABLE_KERNEL_ID)
    off = bf16_choice(hw, KernelOverrides(disabled=frozenset({KERNEL_ID})))
    assert off.kernel_id == AVX2_KERNEL_ID and off.first == AVX2_KERNEL_ID
    assert off.passed == ((KERNEL_ID, DISABLED_REASON),)
    torch_mm = bf16_choice(hw, KernelOverrides(forced_bf16=TORCH_KERNEL_ID))
    assert torch_mm.kernel_id == TORCH_KERNEL_ID and torch_mm.reason == FORCED_TORCH_REASON


def test_a_forced_bf16_kernel_the_host_lacks_falls_back_with_a_warning() -> None:
    choice = bf16_choice(fake_hw(*AVX2_HOST), KernelOverrides(forced_bf16=KERNEL_ID))
    assert choice.kernel_id == AVX2_KERNEL_ID and choice.first == KERNEL_ID
    assert choice.warning is not None and "forced kernel bf16_avx512 cannot run" in \
        choice.warning and "avx512" in choice.warning


def test_disabling_every_bf16_kernel_fails_naming_each() -> None:
    every = frozenset({KERNEL_ID, AVX2_KERNEL_ID, PORTABLE_KERNEL_ID, TORCH_KERNEL_ID})
    with pytest.raises(NoKernelError, match="no bf16 kernel: bf16_avx512: disabled.*torch_mm"):
        bf16_choice(fake_hw(*ALL), KernelOverrides(disabled=every))


def test_the_report_table_marks_forced_and_disabled_bf16_kernels() -> None:
    ov = KernelOverrides(disabled=frozenset({KERNEL_ID}), forced_bf16=PORTABLE_KERNEL_ID)
    tables = build_kernel_report(fake_hw(*ALL), ov)["tables"]
    bf16 = next(t for t in tables if t["name"] == "cpu/bf16")
    rows = {k["kernel_id"]: k for k in bf16["kernels"]}
    assert rows[KERNEL_ID]["disabled"] and not rows[KERNEL_ID]["supported"]
    assert rows[KERNEL_ID]["reason"] == DISABLED_REASON
    assert rows[PORTABLE_KERNEL_ID]["forced"] and rows[PORTABLE_KERNEL_ID]["supported"]
    assert not rows[AVX2_KERNEL_ID]["forced"] and not rows[AVX2_KERNEL_ID]["disabled"]


@needs_avx2
def test_the_lm_head_runs_the_forced_kernel_and_the_report_says_so() -> None:
    hw, report = fake_hw(*AVX2_HOST), KernelReport()
    w, x = _w(100, 64), _x(4, 64, seed=1)
    factory = LinearFactory(hw, KernelOverrides(forced_bf16=PORTABLE_KERNEL_ID), report)
    head = factory("lm_head", w)
    assert head.kernel_id == PORTABLE_KERNEL_ID
    assert torch.equal(head(x), Bf16Gemm.prepare(w, PORTABLE_KERNEL_ID)(x))
    layer = report.snapshot()["layers"][0]
    assert (layer["kernel_id"], layer["first_choice"]) == (PORTABLE_KERNEL_ID,
                                                           PORTABLE_KERNEL_ID)


def test_a_forced_torch_mm_head_turns_exactness_off_and_says_forced() -> None:
    ov = KernelOverrides(forced_bf16=TORCH_KERNEL_ID)
    report = KernelReport()
    head = LinearFactory(fake_hw(*ALL), ov, report)("lm_head", _w(100, 64))
    assert head.kernel_id == TORCH_KERNEL_ID and head.gemm() is None
    line = exactness_warning(report, ov)
    assert line is not None and "torch_mm (forced) is not batch-invariant" in line
