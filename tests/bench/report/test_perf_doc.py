"""docs/performance.md rebuilt from run_all.sh's JSON (bench/report/perf_doc.py): the host
class comes from the recorded probe, a run rewrites only its class's section, and the
section holds the probe line, date, command, summary table and charts. The JSON here is
small but in the shapes the bench commands write (host.json is build_kernel_report's own
output); tests/bench/generate and tests/bench/kernels feed it real runs' JSON too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.report.host_class import class_of, probe_line, recorded_host
from bench.report.perf_doc import (
    begin_marker,
    end_marker,
    main,
    rebuild,
    replace_section,
    summary_table,
)
from engine.hardware import HardwareInfo
from engine.kernels.report import build_kernel_report

AVX2 = ("avx2", "fma", "f16c")
AVX512 = AVX2 + ("avx512f", "avx512bw", "avx512vl", "avx512_bf16")


def features(*flags: str, amx: bool = False) -> dict[str, bool]:
    return HardwareInfo.fake(*flags, amx_permitted=amx).feature_map()


def test_host_class_from_the_probe() -> None:
    assert class_of(features(*AVX2)) == "AVX2"
    assert class_of(features(*AVX2, "avx512f")) == "AVX2"  # no AVX-512 BF16: AVX2 kernels
    assert class_of(features(*AVX512)) == "AVX-512"
    assert class_of(features(*AVX512, "amx_tile", "amx_bf16")) == "AVX-512"  # not granted
    assert class_of(features(*AVX512, "amx_tile", "amx_bf16", amx=True)) == "AMX"
    # the dispatch level says what ran (FP8SERVE_ISA may lower it)
    assert class_of(features(*AVX512, "amx_tile", "amx_bf16", amx=True), "avx2") == "AVX2"
    assert class_of(features(*AVX2), "avx512_vbmi") == "AVX-512"
    with pytest.raises(ValueError, match="no AVX2"):
        class_of(features("fma"))


def write_host(results: Path, *flags: str, isa: str | None = None) -> None:
    hw = HardwareInfo.fake(*flags, cpu_model="AMD EPYC 7B12", dispatch_isa=isa)
    results.mkdir(parents=True, exist_ok=True)
    (results / "host.json").write_text(json.dumps(build_kernel_report(hw)))


def kernel_row(shape: str, m: int, kernel: str, ms: float, bf16_ms: float) -> dict:
    return {"shape": shape, "n": 64, "k": 128, "m": m, "kernel": kernel,
            "role": "baseline" if kernel.startswith("torch_bf16") else "kernel",
            "time_ms": ms, "weight_bytes": 8192, "gbps": 1.0, "tflops": 0.1,
            "bound_ms": 0.01, "pct_of_bound": 0.01 / ms * 100, "vs_bf16": bf16_ms / ms,
            "vs_scaled_mm": None}


def generate_run(name: str, decode: float, llama: float | None, hf: float,
                 python_layers: float | None = None) -> dict:
    base = {"transformers": {"decode_tok_s": hf, "dtype": "float32"}}
    ratios = {"decode_vs_bandwidth_bound": decode / 200.0, "prefill_vs_bf16_matmul": 0.7,
              "decode_vs_transformers": decode / hf}
    if python_layers is not None:
        base["python_layers"] = {"decode_tok_s": python_layers}
        ratios["decode_vs_python_layers"] = decode / python_layers
    if llama is not None:
        base["llamacpp_q8_0"] = {"decode_tok_s": llama}
        ratios["decode_vs_llamacpp_q8_0"] = decode / llama
    return {"host": {"torch_threads": 2}, "config": {"prompt_len": 512, "gen_len": 64},
            "model": {"name": name, "num_layers": 30}, "ratios": ratios, "baselines": base,
            "fp8serve": {"prefill_tok_s": 1000.0, "decode_tok_s": decode},
            "bandwidth_bound": {"decode_tok_s": 200.0}}


@pytest.fixture
def results(tmp_path: Path) -> Path:
    out = tmp_path / "results"
    write_host(out, *AVX2, isa="avx2")
    rows = [kernel_row("q_proj", 1, "torch_bf16_matmul", 0.4, 0.4),
            kernel_row("q_proj", 1, "avx2_w8a16", 0.1, 0.4)]
    (out / "kernels.json").write_text(json.dumps(
        {"schema": 1, "read_bandwidth_gbps": 27.5, "rows": rows, "host": {}}))
    (out / "generate-demo.json").write_text(json.dumps(generate_run("demo", 150.0, 85.0, 15.0)))
    (out / "structured-spec-demo.json").write_text(json.dumps(structured_spec_run()))
    (out / "spec-prediction-text-demo.json").write_text(json.dumps(spec_run()))
    return out


def spec_run() -> dict:
    """bench generate --prediction text's JSON, one workload at one concurrency."""
    passes = {"off": [{"decode_tok_s": 60.0}, {"decode_tok_s": 50.0}],
              "on": [{"decode_tok_s": 120.0}, {"decode_tok_s": 90.0}]}
    row = {"workload": "code-edit", "concurrency": 1, "plain_decode_tok_s": 55.0,
           "spec_decode_tok_s": 105.0, "speedup": 105 / 55, "outputs_identical": True,
           "tokens_per_seq_step": 3.26, "spec": {"acceptance_rate": 0.88}, "passes": passes}
    return {"schema": 1, "threads": 2, "rows": [row], "config": {
        "spec": None, "prediction": "text", "gen_len": 128, "rounds": 2, "oracle": None}}


def structured_spec_run() -> dict:
    """bench structured --speculative-config's JSON, one workload."""
    row = {"workload": "extraction", "concurrency": 1, "plain_decode_tok_s": 30.0,
           "spec_decode_tok_s": 66.0, "speedup": 2.2, "round_speedups": [2.2, 2.1],
           "outputs_identical": True, "tokens_per_step": {"off": 1.0, "on": 2.9},
           "fill_per_step": 0.0027, "spec": {"acceptance_rate": 0.81, "num_forced_tokens": 19}}
    return {"schema": 1, "threads": 2, "rows": [row], "config": {
        "spec": {"method": "ngram", "num_speculative_tokens": 4}, "gen_len": 128,
        "rounds": 2, "oracle": None}}


def test_probe_line_names_cpu_features_and_dispatch(results: Path) -> None:
    assert probe_line(recorded_host(results)) == (
        "host: x86_64 AMD EPYC 7B12 (2 cpus); features on: avx2 fma f16c; "
        "extension dispatch: avx2")


def test_summary_gives_each_ratio_or_says_not_run() -> None:
    rows = summary_table([generate_run("demo", 150.0, 75.0, 15.0, python_layers=60.0),
                          generate_run("3b", 6.0, None, 1.5)])
    cells = [[c.strip() for c in r.strip("|").split("|")] for r in rows[2:]]
    assert cells[0] == ["demo (30 layers)", "512 / 64", "150.0", "2.00 (llamacpp_q8_0)",
                        "10.00 (float32)", "2.50", "0.75", "0.70"]
    assert cells[1][2] == "6.00" and cells[1][3] == "- (not run)"
    assert cells[1][4] == "4.00 (float32)" and cells[1][5] == "-"
    skipped = generate_run("3b", 6.0, None, 1.5)  # llama-cpp-python missing: recorded, no ratio
    skipped["baselines"]["llamacpp"] = {"skipped": "llama-cpp-python is not installed"}
    skipped["ratios"]["decode_vs_llamacpp"] = None
    assert "| - (not run) |" in summary_table([skipped])[2]


def test_a_run_rewrites_only_its_own_section(results: Path, tmp_path: Path) -> None:
    doc = tmp_path / "docs" / "performance.md"
    other = ("## AVX-512 hosts (AVX-512 BF16; no AMX)\n\n" + begin_marker("AVX-512")
             + "\nold figures\n" + end_marker("AVX-512") + "\n\nkept by hand\n")
    doc.parent.mkdir()
    doc.write_text("# Performance\n\nintro\n\n" + other)
    assert rebuild(results, doc, "SKIP=serve bash bench/run_all.sh", "2026-12-02",
                   charts=False) == "AVX2"
    text = doc.read_text()
    assert text.startswith("# Performance\n\nintro\n\n## AVX2 hosts") and text.endswith(other)
    section = text[text.index(begin_marker("AVX2")):text.index(end_marker("AVX2"))]
    assert "Probe: `host: x86_64 AMD EPYC 7B12" in section and "Date: 2026-12-02" in section
    assert "Command: `SKIP=serve bash bench/run_all.sh`" in section
    assert "| demo (30 layers) | 512 / 64 | 150.0 | 1.76 (llamacpp_q8_0) |" in section
    assert "| q_proj (64 x 128) | 1 | avx2_w8a16 | 0.100 | 4.00 |" in section
    assert ("| extraction | 1 | 30.0 | 66.0 | 2.20 | 2.20, 2.10 | 2.90 | 0.81 | 19 | 0.27% | "
            "yes |") in section
    assert ("### Drafts, `prediction-text-demo` (`fp8serve bench generate`, `--prediction "
            "text`, 128 tokens, 2 interleaved rounds)") in section
    assert "| code-edit | 1 | 55.0 | 105.0 | 1.91 | 2.00, 1.80 | 3.26 | 0.88 | yes |" in section
    # a second run replaces the section between the markers, nothing else
    hand = text.replace("## AVX2 hosts (AVX2, FMA, F16C; no AVX-512)\n",
                        "## AVX2 hosts (AVX2, FMA, F16C; no AVX-512)\n\nnote by hand\n")
    doc.write_text(hand + "\ntrailing note\n")
    rebuild(results, doc, "bash bench/run_all.sh", "2026-12-03", charts=False)
    again = doc.read_text()
    assert again == hand.replace("Date: 2026-12-02", "Date: 2026-12-03").replace(
        "SKIP=serve bash", "bash") + "\ntrailing note\n"


def test_charts_are_drawn_and_linked(results: Path, tmp_path: Path) -> None:
    import matplotlib  # noqa: F401  a test extra; the charts need it

    doc = tmp_path / "docs" / "performance.md"
    rebuild(results, doc, "bash bench/run_all.sh", "2026-12-02")
    text = doc.read_text()
    for png in ("img/kernels-avx2.png", "img/decode-avx2.png"):
        assert f"]({png})" in text
        assert (doc.parent / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_new_sections_keep_the_host_class_order() -> None:
    amx = replace_section("", "AMX", ["amx body"])
    assert amx.startswith("# Performance\n") and "amx body" in amx
    both = replace_section(amx, "AVX-512", ["avx512 body"])
    assert both.index("## AVX-512 hosts") < both.index("## AMX hosts")
    assert replace_section(both, "AVX-512", ["new"]).count("avx512 body") == 0
    with pytest.raises(ValueError, match="without"):
        replace_section(begin_marker("AVX2") + "\nno end", "AVX2", ["x"])


def test_command_line_errors_name_the_cause(tmp_path: Path, capsys) -> None:
    with pytest.raises(SystemExit):
        main([str(tmp_path), "--doc", str(tmp_path / "p.md")])
    assert "no host.json" in capsys.readouterr().err
    write_host(tmp_path, *AVX512, isa="avx512")
    assert main([str(tmp_path), "--doc", str(tmp_path / "p.md"), "--date", "2026-12-02"]) == 0
    assert "## AVX-512 hosts" in (tmp_path / "p.md").read_text()


def test_generate_tables_say_which_llama_cpp_library_ran() -> None:
    from bench.report.results import _llamacpp_libraries

    own = {"library": "/v/lib/python3.11/site-packages/llama_cpp/lib/libllama.so",
           "system_info": "CPU : AVX2 = 1"}
    host = {"library": "/c/fp8serve/llama.cpp/0.3.36-ab/build/bin/libllama.so",
            "system_info": "CPU : AVX2 = 1 | AVX512 = 1"}
    runs = [{"baselines": {"llamacpp": own, "transformers": {"decode_tok_s": 1.0}}},
            {"baselines": {"llamacpp_q8_0": host, "llamacpp_bf16": host,
                           "llamacpp_x": {"skipped": "no GGUF"}}}]
    assert _llamacpp_libraries(runs) == [
        "llama.cpp library: built for this host by `fp8serve bench llamacpp` "
        "(`CPU : AVX2 = 1 | AVX512 = 1`).",
        "llama.cpp library: llama-cpp-python's own (`CPU : AVX2 = 1`)."]
