"""`fp8serve bench vision` on a tiny multimodal checkpoint: the table, the JSON, the
serving figures (TTFT, ITL before / during an encode)."""

from __future__ import annotations

import argparse
import json

import cli.bench
from tests.engine.vision.support import write_pair


def test_bench_vision_cli(tmp_path, capsys) -> None:
    hf, _ = write_pair(tmp_path / "m")
    parser = argparse.ArgumentParser(prog="fp8serve")
    cli.bench.register(parser.add_subparsers())
    out = tmp_path / "vision.json"
    args = parser.parse_args(["bench", "vision", "--model", str(hf), "--sizes", "56x84",
                              "112x112", "--serving", "--serving-image", "56x56",
                              "--vision-encoder-threads", "1", "2", "--compare-unfused",
                              "--rounds", "1", "--json", str(out)])
    import bench.vision.run as vb

    real = vb.serving_latency
    vb.serving_latency = lambda m, img, **kw: real(m, img, baseline_s=0.5, **kw)
    try:
        assert args.func(args) == 0
    finally:
        vb.serving_latency = real
    res = json.loads(out.read_text())
    rows = res["encode"]
    assert [r["image_tokens"] for r in rows] == [6, 16]
    assert all(r["gflops"] > 0 and r["ratio"] > 0 and r["bf16_matmul_gflops"] > 0
               for r in rows)
    s = res["serving"]
    assert s["image_tokens"] == 4 and s["prompt_tokens"] > 6 and s["ttft_s"] > 0
    assert s["itl_baseline_median_s"] > 0
    assert [d["encoder_threads"] for d in s["during_encode"]] == [1, 2]
    assert all(d["encode_s"] > 0 and d["window_s"] >= d["encode_s"]
               for d in s["during_encode"])
    fusion = res["fusion"]
    assert [(f["width"], f["height"]) for f in fusion] == [(56, 84), (112, 112)]
    assert all(f["max_abs_diff"] < 0.01 and f["speedup"] > 0 and len(f["fused_s"]) == 1
               for f in fusion)
    assert "ratio" in capsys.readouterr().out
