"""`fp8serve bench generate` on a tiny checkpoint: the JSON has every section, the byte
count per decode token is exact, and the ratios are the quotients of the figures. Never
asserts on timings (the machine is shared)."""

from __future__ import annotations

import argparse
import json

import pytest

from bench.generate.cli import format_table, run
from bench.generate.run import (
    GenerateBenchConfig,
    bench_prompt,
    decode_bytes_per_token,
    prefill_linear_shapes,
)
from engine.loader import load_weights, read_model_config


def _args(model, out, baselines="transformers,llamacpp,python_layers", **kw):
    base = dict(model=model, prompt_len=24, gen_len=5, threads=1, baselines=baselines,
                hf_dtype="float32", gguf=None, bandwidth_mib=16, json=out)
    return argparse.Namespace(**(base | kw))


@pytest.fixture(scope="module")
def result(tiny_checkpoint, tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "generate.json"
    assert run(_args(tiny_checkpoint(), out)) == 0
    return json.loads(out.read_text())


def test_json_sections(result):
    for key in ("host", "config", "model", "read_bandwidth_gbps", "bytes_per_token",
                "fp8serve", "bandwidth_bound", "bf16_matmul", "baselines", "ratios"):
        assert key in result, key
    ours = result["fp8serve"]
    assert ours["prompt_tokens"] == 24 and ours["decode_steps"] == 4
    assert len(ours["output_ids"]) == 5
    assert ours["prefill_tok_s"] == pytest.approx(24 / ours["prefill_s"])
    assert ours["decode_tok_s"] == pytest.approx(4 / ours["decode_s"])
    assert sum(ours["kernels"].values()) > 0
    assert result["host"]["torch_threads"] == 1


def test_baselines_and_ratios(result):
    hf = result["baselines"]["transformers"]
    assert hf["dtype"] == "float32" and hf["decode_steps"] == 4
    assert len(hf["output_ids"]) == 5
    r, ours = result["ratios"], result["fp8serve"]
    for name in ("llamacpp_q8_0", "llamacpp_bf16"):  # the checkpoint's own exports
        lc = result["baselines"][name]
        if "skipped" in lc:
            assert "llama-cpp-python is not installed" in lc["skipped"]
            assert r[f"decode_vs_{name}"] is None
            assert f"{name}: skipped" in format_table(result)
            continue
        assert lc["decode_steps"] == 4 and lc["gguf"].endswith(name[9:].upper() + ".gguf")
        assert r[f"decode_vs_{name}"] == pytest.approx(ours["decode_tok_s"] / lc["decode_tok_s"])
    assert r["decode_vs_transformers"] == pytest.approx(ours["decode_tok_s"] / hf["decode_tok_s"])
    bound = result["read_bandwidth_gbps"] * 1e9 / result["bytes_per_token"]["total"]
    assert result["bandwidth_bound"]["decode_tok_s"] == pytest.approx(bound)
    assert r["decode_vs_bandwidth_bound"] == pytest.approx(ours["decode_tok_s"] / bound)
    assert r["prefill_vs_bf16_matmul"] == pytest.approx(
        ours["prefill_tok_s"] / result["bf16_matmul"]["prefill_tok_s"])
    py = result["baselines"]["python_layers"]  # the same runner, decoder layers in torch
    assert py["decode_steps"] == 4 and py["prompt_tokens"] == 24 and len(py["output_ids"]) == 5
    assert py["bytes_per_token"] == result["bytes_per_token"]["total"]
    assert r["decode_vs_python_layers"] == pytest.approx(
        ours["decode_tok_s"] / py["decode_tok_s"])
    # Same weights, greedy: both engines start with the same token.
    assert result["agreement_tokens"]["transformers"] >= 1
    assert result["agreement_tokens"]["python_layers"] >= 1
    text = format_table(result)
    assert "transformers (float32)" in text and "fp8serve: " in text
    assert "fp8serve, Python layers" in text


def test_bytes_per_token_counts_every_weight(tiny_checkpoint):
    d = tiny_checkpoint()
    cfg = read_model_config(d)
    b = decode_bytes_per_token(load_weights(d, progress=False))
    h, i, q, kv = cfg.hidden_size, cfg.intermediate_size, cfg.q_size, cfg.kv_size
    per_layer = h * (q + 2 * kv) + q * h + 3 * h * i + 7 * 4  # fp8 bytes + fp32 scalar scales
    assert b["fp8_linear_bytes"] == cfg.num_layers * per_layer
    assert b["lm_head_bytes"] == cfg.vocab_size * h * 2  # bf16 head
    assert b["total"] == (b["fp8_linear_bytes"] + b["bf16_linear_bytes"] + b["lm_head_bytes"]
                          + b["embedding_row_bytes"] + b["norm_bytes"])
    flops = sum(n * k for _, n, k in prefill_linear_shapes(cfg))
    assert flops * cfg.num_layers == cfg.num_layers * (per_layer - 28)


def test_prompt_and_config_checks():
    p = bench_prompt(1024, 50, seed=1, bos=1)
    assert len(p) == 50 and p[0] == 1 and all(100 <= t < 1024 for t in p[1:])
    assert p == bench_prompt(1024, 50, seed=1, bos=1)
    with pytest.raises(ValueError, match="unknown baseline"):
        GenerateBenchConfig(model_dir=".", baselines=("vllm",))
    with pytest.raises(ValueError):
        GenerateBenchConfig(model_dir=".", gen_len=1)


def test_results_markdown(result, tmp_path):
    from bench.generate.baselines import llamacpp_available
    from bench.report.results import build_markdown

    (tmp_path / "generate-tiny.json").write_text(json.dumps(result))
    md = build_markdown(tmp_path)
    name = result["model"]["name"]
    row = next(line for line in md.splitlines() if line.startswith(f"| {name}"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[0] == f"{name} (2 layers)" and cells[1] == "1"
    assert cells[3] == f"{result['fp8serve']['decode_tok_s']:.1f}"
    assert cells[4].startswith(f"{result['ratios']['decode_vs_bandwidth_bound']:.2f} of ")
    # llama.cpp's decode when llama-cpp-python is installed, else "-" (skipped)
    ran = [b for n, b in result["baselines"].items()
           if n.startswith("llamacpp") and "decode_tok_s" in b]
    assert bool(ran) == (llamacpp_available() is None)
    assert cells[8] == (f"{ran[0]['decode_tok_s']:.1f}" if ran else "-")
    assert "Kernels" not in md and "peak RSS" not in md  # no such JSON in the directory


def test_bandwidth_probe_samples_bracket_each_timed_phase(result):
    labels = [s["label"] for s in result["read_bandwidth_samples"]]
    assert labels[:4] == ["before bf16 matmul", "after bf16 matmul", "before fp8serve",
                          "after fp8serve"]
    assert "before transformers" in labels and "after transformers" in labels
    around = [s for s in result["read_bandwidth_samples"] if s["label"].endswith("fp8serve")]
    assert result["read_bandwidth_probe"] == "read_xor"
    assert result["read_bandwidth_gbps"] == max(s["read_xor_gbps"] for s in around)
    assert result["torch_sum_bandwidth_gbps"] == max(s["torch_sum_gbps"] for s in around)
    r, ours = result["ratios"], result["fp8serve"]
    bound = result["torch_sum_bandwidth_gbps"] * 1e9 / result["bytes_per_token"]["total"]
    assert r["decode_vs_torch_sum_bound"] == pytest.approx(ours["decode_tok_s"] / bound)
    assert "torch-sum probe" in format_table(result)


def test_fp8_head_bytes_per_token(tiny_checkpoint):
    w = load_weights(tiny_checkpoint(), progress=False)
    v, h = w.config.vocab_size, w.config.hidden_size
    assert decode_bytes_per_token(w, "fp8")["lm_head_bytes"] == v * h + 4 * v
    assert decode_bytes_per_token(w, "bf16")["lm_head_bytes"] == v * h * 2


def test_interleaved_rounds(tiny_checkpoint, tmp_path):
    out = tmp_path / "generate.json"
    assert run(_args(tiny_checkpoint(), out, baselines="", rounds=3)) == 0
    res = json.loads(out.read_text())
    rounds = res["fp8serve"]["rounds"]["decode_tok_s"]
    assert len(rounds) == 3
    assert res["fp8serve"]["decode_tok_s"] == sorted(rounds)[1]  # the median round's
    labels = [s["label"] for s in res["read_bandwidth_samples"]]
    assert labels[2:] == ["before fp8serve", "after fp8serve"] * 3
    assert "rounds decode" in format_table(res)
    with pytest.raises(ValueError, match="rounds"):
        GenerateBenchConfig(model_dir=".", rounds=0)
    with pytest.raises(ValueError, match="gguf-types"):
        GenerateBenchConfig(model_dir=".", gguf_types=("Q4_0",))


def test_rounds_alternate_order_and_ratios_are_per_round():
    from bench.common.read_probe import ReadProbe
    from bench.generate.rounds import Contender, median_round, round_ratios, run_rounds
    from bench.generate.run import GenTiming

    calls = []

    def engine(name, decode_s):
        def gen(prompt, n):
            calls.append(name)
            return GenTiming(len(prompt), 1.0, n - 1, decode_s[len([c for c in calls
                                                                    if c == name]) - 1])
        return Contender(name, gen)

    a, b = engine("a", [1.0, 2.0, 4.0]), engine("b", [2.0, 2.0, 2.0])
    samples: list = []
    t = run_rounds([a, b], [1] * 8, 5, 3, ReadProbe(1 << 16, 1), samples, log=lambda s: None)
    assert calls == ["a", "b", "b", "a", "a", "b"]
    assert [s["label"] for s in samples[:4]] == ["before a", "after a", "before b", "after b"]
    rr = round_ratios(t["a"], t["b"])
    assert rr["decode"] == pytest.approx([2.0, 1.0, 0.5]) and rr["decode_median"] == 1.0
    assert median_round(t["a"]).decode_s == 2.0


def test_perf_doc_reads_a_real_run(result, tmp_path):
    """docs/performance.md's summary and decode chart from this run's JSON
    (bench/report/perf_doc.py; its own tests use small hand-made JSON)."""
    from bench.report.charts import decode_bars
    from bench.report.perf_doc import rebuild
    from engine.hardware import HardwareInfo
    from engine.kernels.report import build_kernel_report

    (tmp_path / "generate-tiny.json").write_text(json.dumps(result))
    hw = HardwareInfo.fake("avx2", "fma", "f16c", dispatch_isa="avx2")
    (tmp_path / "host.json").write_text(json.dumps(build_kernel_report(hw)))
    doc = tmp_path / "performance.md"
    assert rebuild(tmp_path, doc, "bash bench/run_all.sh", "2026-12-02", charts=False) == "AVX2"
    r, name = result["ratios"], result["model"]["name"]
    row = next(ln for ln in doc.read_text().splitlines() if ln.startswith(f"| {name} ("))
    assert f"| {result['fp8serve']['decode_tok_s']:.1f} |" in row
    assert f"| {r['decode_vs_transformers']:.2f} (float32) |" in row
    assert f"| {r['decode_vs_bandwidth_bound']:.2f} |" in row
    bars = dict(decode_bars(result))
    assert bars["fp8serve"] == result["fp8serve"]["decode_tok_s"]
    assert bars["bandwidth bound"] == result["bandwidth_bound"]["decode_tok_s"]
    assert bars["transformers (float32)"] == result["baselines"]["transformers"]["decode_tok_s"]


def test_against_disabled_times_a_second_runner_in_the_same_rounds(tiny_checkpoint, tmp_path):
    """--against-disabled: the same checkpoint on a second runner with a kernel disabled,
    timed in the same rounds; its row names the kernels it ran, and its ratios are the
    median of per-round ratios."""
    from engine.hardware_probe import probe_hardware
    from engine.kernels.base import Fp8Spec, ScaleKind
    from engine.kernels.registry import select_kernel

    model = tiny_checkpoint()
    first = select_kernel(Fp8Spec(64, 64, ScaleKind.PER_TENSOR), probe_hardware()).kernel.id
    out = tmp_path / "generate.json"
    assert run(_args(model, out, baselines="", rounds=3, against_disabled=first)) == 0
    res = json.loads(out.read_text())
    off = res["baselines"]["kernels_off"]
    assert off["disabled"] == [first] and len(off["rounds"]["decode_tok_s"]) == 3
    assert sum(off["kernels"].values()) == sum(res["fp8serve"]["kernels"].values())
    assert not any(k.startswith(first + "/") for k in off["kernels"])
    assert any(k.startswith(first + "/") for k in res["fp8serve"]["kernels"])
    per = res["ratios"]["kernels_off_per_round"]["decode"]
    assert res["ratios"]["decode_vs_kernels_off"] == pytest.approx(sorted(per)[1])
    labels = [s["label"] for s in res["read_bandwidth_samples"]][2:]
    assert labels[:4] == ["before fp8serve", "after fp8serve", "before kernels_off",
                          "after kernels_off"]
    text = format_table(res)
    assert f"fp8serve, {first} off" in text and "fused C++ layers" in text
    with pytest.raises(ValueError, match="unknown kernel"):
        GenerateBenchConfig(model_dir=".", against_disabled=("no_such_kernel",))
