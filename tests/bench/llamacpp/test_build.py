"""bench/llamacpp/build.py: the CMake arguments per host class, the cache key, and the
build's orchestration (download stubbed with a small CMake project that builds the same
two artefacts: bin/llama-server and bin/libllama.so, compiled by the real cmake)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from bench.common.errors import BenchError
from bench.generate.baselines import choose_llamacpp_library
from bench.llamacpp import build as llama_build
from bench.llamacpp.build import cmake_args, ensure_native, host_key, planned, system_info
from engine.hardware import HardwareInfo

AVX2 = HardwareInfo.fake("avx2", "fma", "f16c")
AVX512 = HardwareInfo.fake("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl",
                           "avx512_vnni")
AMX = ("avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
       "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8")

FAKE_CMAKE = """cmake_minimum_required(VERSION 3.13)
project(fake_llama C)
set(CMAKE_RUNTIME_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
set(CMAKE_LIBRARY_OUTPUT_DIRECTORY ${CMAKE_BINARY_DIR}/bin)
add_library(ggml SHARED ggml.c)
add_library(llama SHARED llama.c)
target_link_libraries(llama ggml)
add_executable(llama-server main.c)
target_link_libraries(llama-server llama)
"""
FAKE_GGML = 'const char *ggml_cpu_info(void) { return "CPU : AVX2 = 1 | FAKE = 1 | "; }\n'
FAKE_LIB = ("const char *ggml_cpu_info(void);\n"
            "const char *llama_print_system_info(void) { return ggml_cpu_info(); }\n")
FAKE_MAIN = "const char *llama_print_system_info(void);\nint main(void) { return 0; }\n"


@pytest.mark.parametrize("hw", [AVX2, AVX512, HardwareInfo.fake(*AMX, amx_permitted=True)],
                         ids=["avx2", "avx512", "amx-granted"])
def test_native_where_every_instruction_the_cpu_reports_may_run(hw):
    args, how = cmake_args(hw)
    assert "-DGGML_NATIVE=ON" in args and how == "-march=native"
    assert "-DBUILD_SHARED_LIBS=ON" in args and "-DLLAMA_BUILD_SERVER=ON" in args


def test_amx_without_the_grant_spells_out_the_isa_without_amx():
    args, how = cmake_args(HardwareInfo.fake(*AMX, amx_permitted=False))
    assert "-DGGML_NATIVE=OFF" in args and "without AMX" in how
    for opt in ("AVX", "AVX2", "FMA", "F16C", "AVX512", "AVX512_VNNI", "AVX512_BF16"):
        assert f"-DGGML_{opt}=ON" in args
    assert not [a for a in args if "AMX" in a]


def test_amx_without_the_grant_leaves_out_what_the_cpu_lacks():
    args, _ = cmake_args(HardwareInfo.fake("avx2", "fma", "f16c", "avx512f", "avx512bw",
                                           "avx512vl", "amx_tile"))
    assert "-DGGML_AVX512=ON" in args and "-DGGML_AVX512_BF16=OFF" in args
    assert "-DGGML_AVX512_VNNI=OFF" in args


def test_the_cache_key_changes_with_the_cpu_its_flags_and_the_grant():
    args = cmake_args(AVX2)[0]
    key = host_key("0.3.36", AVX2, args)
    assert key == host_key("0.3.36", AVX2, args) and key.startswith("0.3.36-")
    others = {host_key("0.3.37", AVX2, args), host_key("0.3.36", AVX512, args),
              host_key("0.3.36", HardwareInfo.fake("avx2", "fma", "f16c", cpu_model="other"),
                       args),
              host_key("0.3.36", HardwareInfo.fake(*AMX, amx_permitted=True), args),
              host_key("0.3.36", HardwareInfo.fake(*AMX, amx_permitted=False), args)}
    assert key not in others and len(others) == 5


@pytest.fixture
def fake_source(tmp_path, monkeypatch):
    """fetch_source replaced by a small CMake project, the cache root by tmp_path/cache
    (not FP8SERVE_CACHE_DIR: the extension's cache stays); returns the calls."""
    monkeypatch.setattr(llama_build, "cache_root", lambda: tmp_path / "cache" / "llama.cpp")
    calls = []

    def fetch(version: str, dest: Path, log) -> Path:
        calls.append(version)
        src = dest / "src" / f"llama_cpp_python-{version}" / "vendor" / "llama.cpp"
        src.mkdir(parents=True)
        (src / "CMakeLists.txt").write_text(FAKE_CMAKE)
        (src / "ggml.c").write_text(FAKE_GGML)  # libllama needs it: the RPATH must
        (src / "llama.c").write_text(FAKE_LIB)  # survive the rename of the finished tree
        (src / "main.c").write_text(FAKE_MAIN)
        return src

    monkeypatch.setattr(llama_build, "fetch_source", fetch)
    return calls


def test_builds_once_into_the_cache_and_reports_what_the_library_says(fake_source, tmp_path):
    build = ensure_native(AVX2, log=lambda _: None)
    assert build.is_complete() and build.root.parent == tmp_path / "cache" / "llama.cpp"
    assert build.server.is_file() and not (build.root / "src").exists()
    assert (build.root / ".complete").read_text().split() == cmake_args(AVX2)[0]
    assert not list(build.root.parent.glob("*.partial-*"))
    assert ensure_native(AVX2, log=lambda _: None) == build and len(fake_source) == 1
    assert system_info(build.lib_dir) == "CPU : AVX2 = 1 | FAKE = 1"
    assert planned(AVX512)[0].root != build.root  # another host class builds its own


def test_a_failed_build_names_its_log_and_leaves_no_build(fake_source, monkeypatch):
    monkeypatch.setattr(llama_build, "COMMON", (*llama_build.COMMON, "-DCMAKE_C_FLAGS=-Wbad"
                                                "-flag-that-does-not-exist -Werror"))
    with pytest.raises(BenchError, match=r"cmake (configure|--build) failed .*build\.log"):
        ensure_native(AVX2, log=lambda _: None)
    assert not planned(AVX2)[0].is_complete()


def test_bench_generate_loads_the_host_build_when_there_is_one(fake_source, monkeypatch):
    monkeypatch.delitem(sys.modules, "llama_cpp", raising=False)
    monkeypatch.delenv("LLAMA_CPP_LIB_PATH", raising=False)
    import os

    from engine.hardware_probe import probe_hardware

    hw = probe_hardware()
    assert "own library (no build" in choose_llamacpp_library("auto", print)
    assert "LLAMA_CPP_LIB_PATH" not in os.environ
    build = ensure_native(hw, log=lambda _: None)
    assert str(build.lib_dir) in choose_llamacpp_library("auto", print)
    assert os.environ["LLAMA_CPP_LIB_PATH"] == str(build.lib_dir)
    assert choose_llamacpp_library("installed", print) == "llama-cpp-python's own library"
    assert "LLAMA_CPP_LIB_PATH" not in os.environ


def test_a_library_already_loaded_stays(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", object())
    assert choose_llamacpp_library("native", print) == \
        "the library already loaded in this process"


def test_bench_generate_chooses_the_library_before_anything_imports_llama_cpp(
        monkeypatch, tmp_path):
    from bench.generate import baselines

    monkeypatch.delitem(sys.modules, "llama_cpp", raising=False)
    seen = []
    monkeypatch.setattr(baselines, "choose_llamacpp_library",
                        lambda choice, log: seen.append("llama_cpp" in sys.modules) or "x")
    cfg = type("Cfg", (), {"baselines": ("llamacpp",), "gguf": tmp_path / "none.gguf",
                           "gguf_types": (), "llamacpp_lib": "auto"})()
    engines, skipped = baselines.llamacpp_engines(cfg, [1, 2], 1, lambda _: None)
    assert seen == [False]
    assert engines == {} and "no GGUF" in skipped["llamacpp"]["skipped"]
