"""--max-prefill-tokens-with-decodes / FP8SERVE_MAX_PREFILL_TOKENS_WITH_DECODES reaches the
engine's scheduler; a bad value is a one-line CLI error."""

from __future__ import annotations

import pytest

from cli.main import CliError, build_parser
from cli.serve import settings_from_args
from engine.config import EngineConfig
from engine.engine import Engine
from tests.engine.fake_runner import CacheCheckingRunner
from tests.service.fake_backend import FakeTokenizer


def _settings(argv: list[str]):
    return settings_from_args(build_parser().parse_args(["serve", *argv]))


def test_flag_env_and_default(monkeypatch) -> None:
    monkeypatch.delenv("FP8SERVE_MAX_PREFILL_TOKENS_WITH_DECODES", raising=False)
    assert _settings([]).max_prefill_tokens_with_decodes == 0
    assert _settings(["--max-prefill-tokens-with-decodes", "64"]) \
        .max_prefill_tokens_with_decodes == 64
    monkeypatch.setenv("FP8SERVE_MAX_PREFILL_TOKENS_WITH_DECODES", "32")
    assert _settings([]).max_prefill_tokens_with_decodes == 32
    with pytest.raises(CliError, match="--max-prefill-tokens-with-decodes -1: "):
        _settings(["--max-prefill-tokens-with-decodes", "-1"])


def test_engine_scheduler_gets_the_cap() -> None:
    cfg = EngineConfig(model_dir=".", max_prefill_tokens_with_decodes=48)
    engine = Engine(CacheCheckingRunner(num_kv_blocks=16, block_size=4), FakeTokenizer(), cfg)
    assert engine.scheduler.max_prefill_tokens_with_decodes == 48
    runner = CacheCheckingRunner(num_kv_blocks=16, block_size=4)
    default = Engine(runner, FakeTokenizer(), EngineConfig(model_dir="."))
    assert default.scheduler.max_prefill_tokens_with_decodes is None  # the rest of the budget
    with pytest.raises(ValueError, match="max_prefill_tokens_with_decodes"):
        EngineConfig(model_dir=".", max_prefill_tokens_with_decodes=-1)
