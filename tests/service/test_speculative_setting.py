"""--speculative-config / FP8SERVE_SPECULATIVE_CONFIG: parsed and checked at startup (a bad
key fails naming it), normalised, and handed to the engine."""

from __future__ import annotations

import json

import pytest

from cli.main import CliError, build_parser
from cli.serve import settings_from_args
from engine.spec.config import SpeculativeConfig

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4}


def _settings(argv: list[str]):
    return settings_from_args(build_parser().parse_args(["serve", *argv]))


def test_flag_env_and_default(monkeypatch) -> None:
    monkeypatch.delenv("FP8SERVE_SPECULATIVE_CONFIG", raising=False)
    assert _settings([]).speculative_config is None
    got = _settings(["--speculative-config", json.dumps(SPEC)]).speculative_config
    assert json.loads(got) == {**SPEC, "prompt_lookup_min": 4}
    monkeypatch.setenv("FP8SERVE_SPECULATIVE_CONFIG", json.dumps({**SPEC, "method": "x"}))
    with pytest.raises(CliError, match="speculative_config.*method"):
        _settings([])
    with pytest.raises(CliError, match="'draft_model'"):
        _settings(["--speculative-config", json.dumps({**SPEC, "draft_model": "m"})])


def test_engine_gets_the_parsed_config() -> None:
    from engine.config import EngineConfig
    from engine.engine import Engine
    from tests.engine.fake_runner import CacheCheckingRunner
    from tests.service.fake_backend import FakeTokenizer

    spec = SpeculativeConfig.parse(_settings(["--speculative-config", json.dumps(SPEC)])
                                   .speculative_config)
    eng = Engine(CacheCheckingRunner(), FakeTokenizer(),
                 EngineConfig(model_dir=".", speculative_config=spec))
    assert eng.spec is not None and eng.spec.config.num_speculative_tokens == 3
    assert eng.spec.proposer is not None and eng.spec.may_draft(False)
    # without the config only requests with a predicted output draft
    plain = Engine(CacheCheckingRunner(), FakeTokenizer(), EngineConfig(model_dir="."))
    assert plain.spec.config is None and plain.spec.proposer is None
    assert not plain.spec.may_draft(False) and plain.spec.may_draft(True)


def test_backend_passes_it_to_the_engine_config(monkeypatch, tmp_path) -> None:
    import engine.runner
    from service.backend import load_backend

    seen = []

    def fake_load_runner(model_dir, cfg, **kw):
        seen.append(cfg)
        raise RuntimeError("stop here")

    monkeypatch.setattr(engine.runner, "load_runner", fake_load_runner)
    settings = _settings(["--speculative-config", json.dumps(SPEC), "--model", str(tmp_path)])
    with pytest.raises(RuntimeError, match="stop here"):
        load_backend(settings)
    assert seen[0].speculative_config == SpeculativeConfig("ngram", 3, 4, 4)
