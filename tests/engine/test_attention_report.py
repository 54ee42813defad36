"""The attention path is part of the exactness contract: a model whose heads the C++ paged
attention op does not take (head_dim not a multiple of 32 or above 256, more than 16
query heads per KV head) runs torch SDPA, whose blocking follows the batch. The startup
log says exactness is off, and `fp8serve kernels`, GET /kernels and the metrics name the
path and its reason, as they do for a kernel that is not batch-invariant."""

from __future__ import annotations

import logging

import pytest

import ext
from cli.kernels import format_report
from engine.hardware_probe import probe_hardware
from engine.kernels.registry import KernelOverrides
from engine.kernels.report import build_kernel_report
from engine.runner import ModelRunner
from service.kernel_metrics import kernel_families
from tests.engine.test_model_support import engine_config, random_weights, tiny_config


def _runner(caplog, **config) -> ModelRunner:
    weights = random_weights(tiny_config(**config), seed=3)
    with caplog.at_level(logging.WARNING, logger="engine.runner"):
        return ModelRunner(weights, engine_config(), probe_hardware(), KernelOverrides())


def _samples(snapshot: dict, name: str) -> list:
    (fam,) = [f for f in kernel_families(snapshot) if f.name == f"fp8serve_{name}"]
    return [(s.labels, s.value) for s in fam.samples]


@pytest.mark.skipif(not ext.load().built, reason="the C++ extension is built by CI")
def test_a_head_shape_the_op_does_not_take_turns_exactness_off_visibly(caplog) -> None:
    runner = _runner(caplog, head_dim=48)
    att = runner.kernel_report.attention()
    assert att == {"path": "sdpa", "reason": "head_dim 48 / group 2 not supported",
                   "batch_invariant": False}
    warned = [r.getMessage() for r in caplog.records if "exactness is off" in r.getMessage()]
    assert warned and "attention runs on torch SDPA (head_dim 48" in warned[0], warned
    rep = build_kernel_report(probe_hardware(), None, runner.kernel_report)
    assert rep["attention"] == att and rep["batch_invariant"] is False
    text = format_report(rep)
    assert "attention: torch SDPA, NOT batch-invariant: head_dim 48" in text
    assert "exactness: OFF" in text
    snap = runner.kernel_report.snapshot()
    assert _samples(snap, "batch_invariant") == [({}, 0.0)]
    assert _samples(snap, "attention_path") == [
        ({"path": "sdpa", "reason": "head_dim 48 / group 2 not supported"}, 1.0)]


@pytest.mark.skipif(not ext.load().built, reason="the C++ extension is built by CI")
def test_the_op_keeps_exactness_on(caplog) -> None:
    runner = _runner(caplog)
    assert runner.kernel_report.attention() == {"path": "paged", "reason": None,
                                                "batch_invariant": True}
    rep = build_kernel_report(probe_hardware(), None, runner.kernel_report)
    assert rep["batch_invariant"] is True, rep["summary"]["selected"]
    assert not [r for r in caplog.records if "exactness is off" in r.getMessage()]
    assert _samples(runner.kernel_report.snapshot(), "attention_path") == [
        ({"path": "paged", "reason": ""}, 1.0)]


def test_the_reference_layers_name_their_switch(caplog, monkeypatch) -> None:
    monkeypatch.setenv("FP8SERVE_FUSED", "0")
    runner = _runner(caplog)
    att = runner.kernel_report.attention()
    assert att["path"] == "sdpa" and att["reason"].startswith("FP8SERVE_FUSED=0")
    assert any("attention runs on torch SDPA (FP8SERVE_FUSED=0" in r.getMessage()
               for r in caplog.records)
