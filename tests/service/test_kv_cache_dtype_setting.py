"""--kv-cache-dtype / FP8SERVE_KV_CACHE_DTYPE reaches the engine config; the runner's KV
dtype names the prefix cache's hash root (no block is shared across dtypes)."""

from __future__ import annotations

import pytest

from cli.main import CliError, build_parser
from cli.serve import settings_from_args
from engine.config import EngineConfig
from engine.engine import Engine
from engine.kv.block_hash import root_hash
from tests.engine.fake_runner import CacheCheckingRunner
from tests.service.fake_backend import FakeTokenizer


def _settings(argv: list[str]):
    return settings_from_args(build_parser().parse_args(["serve", *argv]))


def test_flag_env_and_default(monkeypatch) -> None:
    monkeypatch.delenv("FP8SERVE_KV_CACHE_DTYPE", raising=False)
    assert _settings([]).kv_cache_dtype == "auto"
    assert _settings(["--kv-cache-dtype", "fp8"]).kv_cache_dtype == "fp8"
    monkeypatch.setenv("FP8SERVE_KV_CACHE_DTYPE", "bf16")
    assert _settings([]).kv_cache_dtype == "bf16"
    monkeypatch.setenv("FP8SERVE_KV_CACHE_DTYPE", "fp16")
    with pytest.raises(CliError, match="FP8SERVE_KV_CACHE_DTYPE=.fp16.: "):
        _settings([])
    with pytest.raises(ValueError, match="kv_cache_dtype"):
        EngineConfig(model_dir=".", kv_cache_dtype="e5m2")


def test_backend_passes_it_to_the_engine_config(monkeypatch, tmp_path) -> None:
    import engine.runner
    from service.backend import load_backend

    seen: list[EngineConfig] = []

    def fake_load_runner(model_dir, cfg, **kw):
        seen.append(cfg)
        raise RuntimeError("stop here")

    monkeypatch.setattr(engine.runner, "load_runner", fake_load_runner)
    settings = _settings(["--kv-cache-dtype", "fp8", "--model", str(tmp_path)])
    with pytest.raises(RuntimeError, match="stop here"):
        load_backend(settings)
    assert seen[0].kv_cache_dtype == "fp8"


def test_prefix_cache_root_is_the_runner_kv_dtype() -> None:
    runner = CacheCheckingRunner(num_kv_blocks=16, block_size=4)
    runner.kv_dtype = "float8_e4m3fn"  # what ModelRunner reports for --kv-cache-dtype fp8
    engine = Engine(runner, FakeTokenizer(), EngineConfig(model_dir="."))
    cache = engine.scheduler.prefix_cache
    assert cache is not None and cache.hasher.root == root_hash("float8_e4m3fn")
    assert cache.hasher.root != root_hash("bfloat16")


@pytest.mark.parametrize("argv", [["generate", "--prompt", "x"], ["bench", "generate"]])
def test_generate_and_bench_generate_take_the_flag(argv: list[str]) -> None:
    args = build_parser().parse_args([*argv, "--kv-cache-dtype", "fp8"])
    assert args.kv_cache_dtype == "fp8"
    if argv[0] == "bench":
        from bench.generate.cli import config_from_args

        assert config_from_args(args).kv_cache_dtype == "fp8"
