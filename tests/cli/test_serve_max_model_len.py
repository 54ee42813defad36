"""`fp8serve serve` without --max-model-len (nor FP8SERVE_MAX_MODEL_LEN) serves at most the
checkpoint's max_position_embeddings, as vLLM's default does; the default 4096 stays the
cap for longer models, and a value given either way is kept (above the limit: a warning,
tests/engine/test_runner.py)."""

from __future__ import annotations

import pytest

import cli.serve_startup as startup
from cli.main import CliError
from service.backend import default_max_model_len
from service.settings import Settings


@pytest.fixture(scope="module")
def model(tiny_checkpoint):
    return tiny_checkpoint()  # max_position_embeddings 512


def test_the_default_is_lowered_to_the_checkpoint_limit(model, monkeypatch) -> None:
    monkeypatch.delenv("FP8SERVE_MAX_MODEL_LEN", raising=False)
    assert default_max_model_len(Settings(model=model)) == 512
    assert startup._fit_max_model_len(Settings(model=model)).max_model_len == 512
    assert default_max_model_len(Settings()) == 4096  # the demo model: 8192 positions


def test_a_value_given_by_flag_or_environment_is_kept(model, monkeypatch) -> None:
    assert default_max_model_len(Settings(model=model, max_model_len=2048)) == 2048
    monkeypatch.setenv("FP8SERVE_MAX_MODEL_LEN", "1024")
    assert startup._fit_max_model_len(Settings(model=model)).max_model_len == 1024


def test_an_unreadable_config_is_a_one_line_error(tmp_path) -> None:
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CliError, match="config.json"):
        startup._fit_max_model_len(Settings(model=tmp_path))
