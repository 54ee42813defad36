"""--lm-head-dtype (engine/model/lm_head.py): per-output-channel FP8 quantization of the
head (shapes, dtypes, scales, round trip), the FP8 head's logits against the bf16 head's
within a derived bound, batch invariance of the FP8 head, and the flag reaching the
runner, the kernel report (GET /kernels) and the CLIs; bad values rejected."""

from __future__ import annotations

import argparse

import pytest
import torch

from engine.config import ConfigError, EngineConfig
from engine.kernels.base import FP8_DTYPE, FP8_MAX, Fp8Weight, ScaleKind
from engine.loader import load_weights
from engine.model.lm_head import (
    QuantizedHeadSource,
    dequantize,
    head_weight,
    quantize_per_channel,
)

E4M3_HALF_ULP = 2.0**-4  # 3 mantissa bits: round to nearest is within 2^-4 relative


def _table(n=300, k=96, seed=0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(n, k, generator=g) * torch.logspace(-3, 1, n)[:, None]
    w[7] = 0.0  # an all-zero row
    return w.bfloat16()


def test_quantize_shapes_dtypes_and_scales():
    w = _table()
    q = quantize_per_channel(w)
    q.validate("lm_head")
    assert q.scale_kind is ScaleKind.PER_CHANNEL and q.weight.dtype == FP8_DTYPE
    assert tuple(q.weight.shape) == (300, 96) and tuple(q.scale.shape) == (300,)
    amax = w.float().abs().amax(dim=1)
    want = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    assert torch.equal(q.scale, want)  # amax / 448 in fp32, exactly
    assert q.scale[7] == 1.0 and not q.weight[7].float().any()
    # every non-zero row uses the full e4m3 range: its largest code is +-448
    top = q.weight.float().abs().amax(dim=1)
    assert torch.all(top[amax > 0] == FP8_MAX)


def test_round_trip_error_is_within_half_an_e4m3_ulp():
    w = _table(seed=1)
    back = dequantize(quantize_per_channel(w)).float()
    wf = w.float()
    s = wf.abs().amax(dim=1, keepdim=True) / FP8_MAX
    # relative half-ulp for normals, plus the subnormal step (2^-9 * s) near zero, plus
    # the bf16 rounding of the dequantized value (2^-9 relative)
    bound = wf.abs() * (E4M3_HALF_ULP + 2.0**-8) + s * 2.0**-10
    assert torch.all((back - wf).abs() <= bound)


def test_quantize_rejects_non_bf16_or_non_matrix():
    with pytest.raises(ValueError, match=r"\[N, K\] bf16"):
        quantize_per_channel(torch.zeros(4, 4))
    with pytest.raises(ValueError, match=r"\[N, K\] bf16"):
        quantize_per_channel(torch.zeros(4, dtype=torch.bfloat16))


@pytest.mark.parametrize("kind", list(ScaleKind))
def test_dequantize_every_scale_kind(kind):
    g = torch.Generator().manual_seed(2)
    w8 = (torch.randn(200, 160, generator=g) * 50).clamp(-448, 448).to(FP8_DTYPE)
    shape = {ScaleKind.PER_TENSOR: (), ScaleKind.PER_CHANNEL: (200,),
             ScaleKind.BLOCK: (2, 2)}[kind]
    s = torch.rand(shape, generator=g) + 0.5
    w = Fp8Weight(w8, s, kind)
    if kind is ScaleKind.PER_TENSOR:
        full = s
    elif kind is ScaleKind.PER_CHANNEL:
        full = s[:, None]
    else:
        full = s.repeat_interleave(128, 0)[:200].repeat_interleave(128, 1)[:, :160]
    assert torch.equal(dequantize(w), (w8.float() * full).bfloat16())


def test_head_weight_per_dtype(tiny_checkpoint):
    weights = load_weights(tiny_checkpoint(tie_word_embeddings=True), progress=False)
    assert head_weight(weights, "auto") is weights.embed_tokens
    assert head_weight(weights, "bf16") is weights.embed_tokens
    src = head_weight(weights, "fp8")
    assert isinstance(src, QuantizedHeadSource) and src.build().n == weights.config.vocab_size
    fp8_head = quantize_per_channel(weights.embed_tokens)
    untied = type(weights)(weights.config, weights.embed_tokens, weights.layers,
                           weights.norm, fp8_head)
    assert head_weight(untied, "fp8") is fp8_head  # an FP8 head is kept as stored
    assert torch.equal(head_weight(untied, "bf16"), dequantize(fp8_head))
    with pytest.raises(ValueError, match="auto, bf16, fp8"):
        head_weight(weights, "fp16")


def test_engine_config_rejects_unknown_dtype(tmp_path):
    with pytest.raises(ConfigError, match="lm_head_dtype 'int8'"):
        EngineConfig(model_dir=tmp_path, lm_head_dtype="int8")


def _runner(model_dir, dtype):
    from engine.hardware_probe import probe_hardware
    from engine.kernels.registry import KernelOverrides
    from engine.runner import ModelRunner

    cfg = EngineConfig(model_dir=model_dir, max_num_seqs=1, max_model_len=64,
                       kv_cache_gib=1 / 256, lm_head_dtype=dtype)
    return ModelRunner(load_weights(model_dir, progress=False), cfg, probe_hardware(),
                       KernelOverrides())


@pytest.fixture(scope="module")
def runners(tiny_checkpoint):
    d = tiny_checkpoint(tie_word_embeddings=True)
    return {t: _runner(d, t) for t in ("bf16", "fp8")}


def _hidden(runner, ids):
    from engine.batch import BatchInputs, LogitsWanted, SeqChunk

    chunk = SeqChunk(0, tuple(ids), 0, (0, 1, 2, 3), LogitsWanted.ALL)
    return runner.hidden(BatchInputs((chunk,)))


def test_flag_reaches_the_runner_and_the_kernel_report(runners):
    from engine.hardware_probe import probe_hardware
    from engine.kernels.report import build_kernel_report

    fp8 = runners["fp8"]
    choice = fp8.kernel_report.choices["lm_head"]
    assert choice.scale_kind == "per_channel" and choice.n == fp8.config.vocab_size
    assert fp8.model.lm_head.kernel.kernel.id == choice.kernel_id
    layers = build_kernel_report(probe_hardware(), None, fp8.kernel_report)["layers"]
    assert [x["kernel_id"] for x in layers if x["layer"] == "lm_head"] == [choice.kernel_id]
    bf16 = runners["bf16"]
    head = bf16.kernel_report.choices["lm_head"]  # the bf16 head: its bf16 kernel
    assert head.scale_kind == "bf16" and head.kernel_id == bf16.model.lm_head.kernel_id
    assert head.n == bf16.config.vocab_size and head.first_choice == head.kernel_id


def test_fp8_logits_close_to_bf16_within_the_quantization_bound(runners):
    """|logit_fp8 - logit_bf16| <= sum_k |h_k| |w_nk| * 2^-4 (each weight within half an
    e4m3 ulp; the subnormal term is below it for these weights) + the bf16 rounding of
    both logits (2^-8 * |logit| each) + fp32 accumulation slack: a bound any orientation
    or scale mistake exceeds by orders of magnitude."""
    ids = list(range(5, 45))
    h = _hidden(runners["bf16"], ids)
    assert torch.equal(h, _hidden(runners["fp8"], ids))  # same decoder, same hidden rows
    ref = runners["bf16"].model.lm_head(h).float()
    got = runners["fp8"].model.lm_head(h).float()
    w = runners["bf16"].model.embed.float()
    bound = (h.float().abs() @ w.abs().T) * (E4M3_HALF_ULP + 2.0**-7) + 2.0**-7 * ref.abs()
    assert torch.all((got - ref).abs() <= bound + 1e-3)
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.5


def test_fp8_head_rows_are_batch_invariant(runners):
    head = runners["fp8"].model.lm_head
    h = _hidden(runners["fp8"], list(range(100, 137)))
    batched = head(h)
    for i in (0, 1, 2, 17, 36):
        assert torch.equal(head(h[i:i + 1].contiguous()), batched[i:i + 1])
    assert torch.equal(head(h[3:8].contiguous()), batched[3:8])


def test_cli_flags_accept_the_three_values_and_reject_others():
    from engine.config_flags import add_lm_head_arg

    p = argparse.ArgumentParser()
    add_lm_head_arg(p)
    assert p.parse_args([]).lm_head_dtype is None
    for v in ("auto", "bf16", "fp8"):
        assert p.parse_args(["--lm-head-dtype", v]).lm_head_dtype == v
    with pytest.raises(SystemExit):
        p.parse_args(["--lm-head-dtype", "fp16"])


def test_serve_settings_carry_the_flag(monkeypatch):
    from pydantic import ValidationError

    from cli.serve import settings_from_args
    from service.settings import Settings

    assert Settings().lm_head_dtype == "auto"
    monkeypatch.setenv("FP8SERVE_LM_HEAD_DTYPE", "fp8")
    assert Settings().lm_head_dtype == "fp8"
    with pytest.raises(ValidationError):
        Settings(lm_head_dtype="fp4")
    p = argparse.ArgumentParser()
    sub = p.add_subparsers()
    from cli import serve

    serve.register(sub)
    args = p.parse_args(["serve", "--lm-head-dtype", "bf16"])
    assert settings_from_args(args).lm_head_dtype == "bf16"
