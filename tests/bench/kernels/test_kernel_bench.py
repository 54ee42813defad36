"""`fp8serve bench kernels --quick` on a tiny shape set: the JSON structure, not timings."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

import bench.kernels.cli as bench_cli
from bench.common.errors import BenchError
from bench.common.timing import copies_to_exceed, llc_bytes
from bench.kernels.table import format_rows
from bench.report.perf_doc import rebuild
from engine.hardware import HardwareInfo

HW = HardwareInfo.fake("avx2", "fma", "f16c")
ROW_KEYS = {"shape", "n", "k", "m", "kernel", "role", "time_ms", "weight_bytes", "gbps",
            "tflops", "bound_ms", "pct_of_bound", "vs_bf16", "vs_scaled_mm"}


def tmp_path_results(kernels_json: Path) -> Path:
    """A results directory holding ``kernels_json`` as kernels.json."""
    out = kernels_json.parent / "results"
    out.mkdir()
    (out / "kernels.json").write_text(kernels_json.read_text())
    return out


def parse(*argv: str) -> argparse.Namespace:
    p = argparse.ArgumentParser()
    bench_cli.register(p.add_subparsers())
    return p.parse_args(["kernels", *argv])


def test_quick_run_writes_json_table_and_plot(tmp_path: Path, capsys) -> None:
    out_json, out_png = tmp_path / "k.json", tmp_path / "k.png"
    args = parse("--quick", "--shapes", "64x128,48x200", "--m", "1,3,9",
                 "--kernels", "torch_w8a16,avx2_w8a16", "--json", str(out_json),
                 "--png", str(out_png))
    assert bench_cli.run(args, hw=HW) == 0
    res = json.loads(out_json.read_text())
    assert res["schema"] == 1 and res["read_bandwidth_gbps"] > 0 and res["llc_bytes"] > 0
    assert res["config"]["ms"] == [1, 3]  # --quick keeps the first two M values
    assert res["host"]["features"]["avx2"] is True
    rows = res["rows"]
    assert all(set(r) == ROW_KEYS for r in rows)
    got = {(r["shape"], r["m"], r["kernel"]) for r in rows}
    for shape in ("64x128", "48x200"):
        for m in (1, 3):
            assert (shape, m, "torch_bf16_matmul") in got
            assert (shape, m, "torch_w8a16") in got
        assert (shape, 1, "torch_scaled_mm_w8a8") in got  # only at the first M in quick
        assert (shape, 3, "torch_scaled_mm_w8a8") not in got
    for r in rows:
        assert r["time_ms"] > 0 and r["weight_bytes"] in (r["n"] * r["k"], 2 * r["n"] * r["k"])
        assert r["vs_bf16"] is not None
        assert (r["vs_scaled_mm"] is None) == (r["m"] != 1)
        if r["kernel"] == "torch_bf16_matmul":
            assert r["vs_bf16"] == 1.0 and r["role"] == "baseline"
    # a kernel this (fake) host cannot run is skipped with its reason
    skipped = {(s["kernel"], s["shape"]) for s in res["skipped"]}
    assert ("avx2_w8a16", "64x128") in skipped
    # docs/performance.md's kernel table and host class read this JSON (no host.json here)
    doc = tmp_path / "performance.md"
    assert rebuild(tmp_path_results(out_json), doc, "make bench", "2026-12-02",
                   charts=False) == "AVX2"
    assert "| 48x200 (48 x 200) | 3 | " in doc.read_text()
    assert all(s["reason"] for s in res["skipped"])
    assert any("_scaled_mm" in n for n in res["notes"])
    text = capsys.readouterr().out
    assert "torch_w8a16" in text and "% bound" in text
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        assert "matplotlib is not installed" in text
    else:
        assert out_png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_an_m_too_slow_to_time_is_listed_as_skipped(tmp_path: Path, capsys) -> None:
    """A kernel whose call at a larger M would take longer than --max-seconds-per-call
    (estimated from the smaller M's time) is timed at the smaller M only, and the larger
    one is listed with the reason (torch._scaled_mm's reference loop on AMX hosts took
    minutes per call)."""
    out_json = tmp_path / "k.json"
    args = parse("--quick", "--shapes", "64x128", "--m", "1,64", "--kernels", "torch_w8a16",
                 "--max-seconds-per-call", "1e-9", "--json", str(out_json),
                 "--png", str(tmp_path / "k.png"))
    assert bench_cli.run(args, hw=HW) == 0
    res = json.loads(out_json.read_text())
    got = {(r["kernel"], r["m"]) for r in res["rows"]}
    assert ("torch_w8a16", 1) in got and ("torch_w8a16", 64) not in got
    assert ("torch_bf16_matmul", 64) in got  # the baseline matmul is timed at every M
    why = [s["reason"] for s in res["skipped"] if s["kernel"] == "torch_w8a16"]
    assert len(why) == 1 and why[0].startswith("not timed at M=64: one call at M=1 took")
    assert "skipped torch_w8a16 on 64x128: not timed at M=64" in capsys.readouterr().out


def test_bad_arguments_are_one_line_errors() -> None:
    with pytest.raises(BenchError, match="NxK"):
        bench_cli.config_from_args(parse("--shapes", "q_proj"))
    with pytest.raises(BenchError, match="--m"):
        bench_cli.config_from_args(parse("--m", "1,x"))
    with pytest.raises(BenchError, match="unknown kernel"):
        bench_cli.config_from_args(parse("--kernels", "avx9000"))
    with pytest.raises(BenchError, match="--m: M values must be >= 1, got 0"):
        bench_cli.config_from_args(parse("--m", "0"))
    with pytest.raises(BenchError, match="--scaled-mm-m: M values must be >= 1"):
        bench_cli.config_from_args(parse("--scaled-mm-m", "0"))
    with pytest.raises(BenchError, match="--reps 0: must be >= 1"):
        bench_cli.config_from_args(parse("--reps", "0"))
    with pytest.raises(BenchError, match="--max-seconds-per-call"):
        bench_cli.config_from_args(parse("--max-seconds-per-call", "0"))


def test_quick_keeps_scaled_mm_left_out() -> None:
    assert bench_cli.config_from_args(parse("--quick", "--scaled-mm-m", "")).scaled_mm_ms == ()
    assert bench_cli.config_from_args(parse("--quick", "--m", "4,8")).scaled_mm_ms == (4,)


def test_default_shapes_are_ministral_3_8b() -> None:
    cfg = bench_cli.config_from_args(parse())
    assert [(s.n, s.k) for s in cfg.shapes] == [(4096, 4096), (1024, 4096), (14336, 4096),
                                               (4096, 14336)]
    assert cfg.ms == (1, 8, 32, 128, 512)


def test_rotation_exceeds_the_cache(tmp_path: Path) -> None:
    (tmp_path / "index0").mkdir()
    (tmp_path / "index0" / "size").write_text("48K\n")
    (tmp_path / "index3").mkdir()
    (tmp_path / "index3" / "size").write_text("32768K\n")
    assert llc_bytes(tmp_path) == 32 << 20
    n = copies_to_exceed(16 << 20, 32 << 20)
    assert n * (16 << 20) > 2 * (32 << 20)
    assert copies_to_exceed(1 << 30, 32 << 20) == 2


def test_table_groups_rows() -> None:
    row = dict(shape="s", n=1, k=1, m=1, kernel="a", role="kernel", time_ms=1.0,
               weight_bytes=1, gbps=1.0, tflops=1.0, bound_ms=1.0, pct_of_bound=100.0,
               vs_bf16=None, vs_scaled_mm=2.0)
    text = format_rows([row, {**row, "m": 2}])
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["shape", "M", "kernel"]
    assert "" in lines  # blank line between M groups
    assert " - " in lines[2] and "2.00" in lines[2]


def test_fp8serve_prints_a_bench_error_as_one_line(capsys) -> None:
    """cli/bench.py turns a benchmark's BenchError into fp8serve's one-line error, exit 1."""
    from cli.main import main

    assert main(["bench", "kernels", "--m", "0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("fp8serve: error: ") and "--m: M values must be >= 1" in err
    assert err.count("\n") == 1


def test_block_scales_run_the_block_kernels(tmp_path: Path) -> None:
    """--scale-kind block: 128 x 128 block scales; the block kernels run (here torch's and,
    where the extension runs AVX2, avx2_block_w8a16), _scaled_mm is skipped with why, and
    the bf16 baseline runs on the dequantized weight."""
    import ext
    from engine.hardware_probe import probe_hardware

    hw = probe_hardware()
    out = tmp_path / "k.json"
    args = parse("--quick", "--shapes", "256x384", "--m", "1,5", "--scale-kind", "block",
                 "--kernels", "torch_block_w8a16,avx2_block_w8a16", "--json", str(out),
                 "--png", str(tmp_path / "k.png"))
    assert bench_cli.run(args, hw=hw) == 0
    res = json.loads(out.read_text())
    assert res["config"]["scale_kind"] == "block"
    got = {(r["kernel"], r["m"]) for r in res["rows"]}
    assert {("torch_bf16_matmul", 1), ("torch_block_w8a16", 1), ("torch_block_w8a16", 5)} <= got
    if ext.load().built and ext.isa() != "scalar":
        assert {("avx2_block_w8a16", 1), ("avx2_block_w8a16", 5)} <= got
    assert any(s["kernel"] == "torch_scaled_mm_w8a8" and "block" in s["reason"]
               for s in res["skipped"])


def test_threads_sets_the_thread_count_every_point_is_timed_at(tmp_path: Path, monkeypatch,
                                                                capsys) -> None:
    """--threads (as the other benchmarks take it; bench kernels had none, so its kernels
    always ran on every core): every timed call runs at that torch thread count, and the
    JSON records it."""
    import torch

    import bench.kernels.cpu as cpu

    before = torch.get_num_threads()
    want = 2 if before == 1 else 1
    seen: set[int] = set()
    timed = cpu.time_calls

    def recording(*a, **kw):
        seen.add(torch.get_num_threads())
        return timed(*a, **kw)

    monkeypatch.setattr(cpu, "time_calls", recording)
    out_json = tmp_path / "k.json"
    args = parse("--quick", "--shapes", "64x128", "--m", "1", "--kernels", "torch_w8a16",
                 "--threads", str(want), "--json", str(out_json), "--png",
                 str(tmp_path / "k.png"))
    try:
        assert bench_cli.run(args, hw=HW) == 0
    finally:
        torch.set_num_threads(before)
    res = json.loads(out_json.read_text())
    assert seen == {want}
    assert res["config"]["threads"] == want and res["host"]["threads"] == want
    assert f"; {want} threads" in capsys.readouterr().out
