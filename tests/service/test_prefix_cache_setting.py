"""--enable-prefix-caching / --no-enable-prefix-caching / FP8SERVE_ENABLE_PREFIX_CACHING
reach the engine: on by default, off leaves the scheduler without a cache."""

from __future__ import annotations

from cli.main import build_parser
from cli.serve import settings_from_args
from engine.config import EngineConfig
from engine.engine import Engine
from tests.engine.fake_runner import CacheCheckingRunner
from tests.service.fake_backend import FakeTokenizer


def _settings(argv: list[str]):
    return settings_from_args(build_parser().parse_args(["serve", *argv]))


def test_flag_env_and_default(monkeypatch) -> None:
    monkeypatch.delenv("FP8SERVE_ENABLE_PREFIX_CACHING", raising=False)
    assert _settings([]).enable_prefix_caching is True
    assert _settings(["--no-enable-prefix-caching"]).enable_prefix_caching is False
    monkeypatch.setenv("FP8SERVE_ENABLE_PREFIX_CACHING", "false")
    assert _settings([]).enable_prefix_caching is False
    assert _settings(["--enable-prefix-caching"]).enable_prefix_caching is True


def test_engine_builds_the_cache_only_when_enabled() -> None:
    def engine(enabled: bool) -> Engine:
        cfg = EngineConfig(model_dir=".", enable_prefix_caching=enabled)
        return Engine(CacheCheckingRunner(num_kv_blocks=16, block_size=4), FakeTokenizer(), cfg)

    assert engine(True).scheduler.prefix_cache is not None
    assert engine(False).scheduler.prefix_cache is None
