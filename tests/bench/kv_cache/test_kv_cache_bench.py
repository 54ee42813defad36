"""fp8serve bench kv-cache on a tiny checkpoint: the report's structure, the two stores
holding the same K/V (fp8 = the bf16 values quantized), and the CLI summary. No timing
assertions: the figures are ratios printed for people."""

from __future__ import annotations

import pytest
import torch

from bench.common.errors import BenchError
from bench.kv_cache.cli import format_summary
from bench.kv_cache.run import (
    KvCacheBenchConfig,
    fill_random,
    load_runner,
    run_kv_cache_bench,
    stores,
)
from engine.model.kv_store import quantize_kv
from tests.engine.kv_layout import slots_of


def test_report_structure(tiny_checkpoint) -> None:
    cfg = KvCacheBenchConfig(model_dir=tiny_checkpoint(), contexts=(40,), speed_rounds=2,
                             speed_tokens=2, greedy_tokens=4, num_prompts=1)
    res = run_kv_cache_bench(cfg, log=lambda s: None)
    b = res["kv_bytes_per_block"]
    assert b["fp8"] < b["bf16"]
    sp = res["speed"]["40"]
    assert len(sp["decode_tok_s"]["bf16"]) == len(sp["ratio_per_round"]) == 2
    acc = res["accuracy"]
    assert len(acc["greedy"]) == 1 and 0 <= acc["greedy"][0]["leading_agree"] <= 4
    assert 0.0 <= acc["top1"] <= 1.0 and 0.0 <= acc["kl_mean"] <= acc["kl_max"]
    assert 0.0 <= acc["kl_p99"] <= acc["kl_max"]
    assert "fp8 / bf16 median" in format_summary(res)


def test_stores_hold_the_same_values(tiny_checkpoint) -> None:
    runner = load_runner(KvCacheBenchConfig(model_dir=tiny_checkpoint()), 64)
    st = stores(runner)
    fill_random(st, 20)
    b, f = st["bf16"].layer(1), st["fp8"].layer(1)
    q, s = quantize_kv(slots_of(b.v)[:20])
    assert bool(slots_of(b.v)[:20].ne(0).any()) and not bool(slots_of(b.v)[20:].ne(0).any())
    assert torch.equal(slots_of(f.v.view(torch.uint8))[:20], q.view(torch.uint8))
    assert torch.equal(slots_of(f.v_scale)[:20], s)


def test_attention_op_only(tiny_checkpoint, tmp_path) -> None:
    import argparse
    import json

    from bench.kv_cache.cli import format_op, run

    out = tmp_path / "op.json"
    args = argparse.Namespace(model=tiny_checkpoint(), contexts="40", speed_rounds=3,
                              speed_tokens=1, greedy_tokens=0, prompts=1, threads=1,
                              op_only=True, json=out)
    assert run(args) == 0
    res = json.loads(out.read_text())
    r = res["48"]  # 40 keys rounded up to whole blocks of 16
    assert len(r["seconds"]["bf16"]) == len(r["seconds"]["fp8"]) == len(r["ratio_per_rep"]) == 3
    h, d = res["kv_heads"], res["head_dim"]
    assert r["kv_bytes"] == {"bf16": 2 * 48 * h * d * 2, "fp8": 2 * 48 * h * (d + 4)}
    assert "48 keys fp8 / bf16 time per rep" in format_op(res)
    assert res["layers"] == 1 and res["isa"] in ("scalar", "avx2", "avx512", "avx512_vbmi", "amx")


def test_attention_op_only_over_layer_copies(tiny_checkpoint, tmp_path) -> None:
    import argparse
    import json

    from bench.kv_cache.cli import format_op, run

    out = tmp_path / "op.json"
    args = argparse.Namespace(model=tiny_checkpoint(), contexts="20", speed_rounds=2,
                              speed_tokens=1, greedy_tokens=0, prompts=1, threads=1,
                              op_only=True, op_layers=3, json=out)
    assert run(args) == 0
    res = json.loads(out.read_text())
    assert res["layers"] == 3 and len(res["32"]["seconds"]["fp8"]) == 2
    assert "3 K/V copies per rep" in format_op(res)
    with pytest.raises(BenchError, match="--op-layers 0"):
        run(argparse.Namespace(**{**vars(args), "op_layers": 0}))
