"""--vision-encoder-threads: the encoder thread's torch intra-op cap is its own (the
caller's count and the default fresh threads adopt stay as they were), the setting
reaches the encoder through startup, and bad values are refused at startup."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
import torch

from bench.vision.run import noise_png
from cli.main import CliError, build_parser
from cli.serve import settings_from_args
from engine.text.tokenizer import Tokenizer
from engine.vision.encoder_thread import EncoderThread, available_cpus
from service.settings import Settings
from service.vision_setup import load_vision_runtime
from tests.engine.vision.support import write_pair


def _fresh_thread_count() -> int:
    out: list[int] = []
    t = threading.Thread(target=lambda: out.append(torch.get_num_threads()))
    t.start()
    t.join()
    return out[0]


def test_the_cap_stays_on_the_encoder_thread() -> None:
    before = torch.get_num_threads()
    worker = EncoderThread(1)
    try:
        assert worker.effective == worker.run(torch.get_num_threads) == 1
        assert torch.get_num_threads() == before
        assert _fresh_thread_count() == before  # the process default was written back
        assert worker.run(torch.get_num_threads) == 1  # and the worker kept its cap
    finally:
        worker.close()


def test_default_is_the_callers_count_and_errors_surface() -> None:
    worker = EncoderThread()
    try:
        assert worker.effective == torch.get_num_threads()
        with pytest.raises(ZeroDivisionError):
            worker.run(lambda: 1 / 0)
    finally:
        worker.close()
    with pytest.raises(ValueError, match=">= 1"):
        EncoderThread(0)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_pair(tmp_path_factory.mktemp("vision-threads"))[0]


def test_setting_reaches_the_encoder(model: Path) -> None:
    settings = Settings(model=model, vision_encoder_threads=1)
    vision, why = load_vision_runtime(model, settings, Tokenizer.from_dir(model))
    assert why is None and vision.describe()["encoder_threads"] == 1
    seen: dict[str, Any] = {}

    class Spy:
        config = vision.encoder.config

        def __call__(self, pixels: torch.Tensor, real: Any = vision.encoder) -> torch.Tensor:
            seen["threads"] = torch.get_num_threads()
            seen["thread"] = threading.current_thread()
            return real(pixels)

    vision.encoder = Spy()
    out = vision.encode(noise_png(56, 56))
    assert out.features.shape == (4, 256) and not out.cached
    assert seen["threads"] == 1 and seen["thread"] is not threading.current_thread()
    assert seen["thread"].name.startswith("fp8serve-vision-encoder")
    vision.worker.close()


def _settings(argv: list[str]) -> Settings:
    return settings_from_args(build_parser().parse_args(["serve", *argv]))


def test_flag_and_bad_values_at_startup(monkeypatch) -> None:
    monkeypatch.delenv("FP8SERVE_VISION_ENCODER_THREADS", raising=False)
    assert _settings([]).vision_encoder_threads is None
    assert _settings(["--vision-encoder-threads", "1"]).vision_encoder_threads == 1
    for bad, why in (("0", "greater than or equal to 1"),
                     (str(available_cpus() + 1), "CPUs")):
        with pytest.raises(CliError, match=f"--vision-encoder-threads {bad}: .*{why}"):
            _settings(["--vision-encoder-threads", bad])
    monkeypatch.setenv("FP8SERVE_VISION_ENCODER_THREADS", "1")
    assert _settings([]).vision_encoder_threads == 1


def test_model_threads_and_the_media_directory_are_checked_at_startup(tmp_path) -> None:
    """--threads past the CPUs this process may use (it started 10000 torch threads'
    worth of pool without a word) and an --allowed-local-media-path that is no directory
    are startup errors naming the setting."""
    assert _settings(["--threads", "1"]).threads == 1
    with pytest.raises(CliError, match="--threads [0-9]+: .*CPUs"):
        _settings(["--threads", str(available_cpus() + 1)])
    assert _settings(["--allowed-local-media-path", str(tmp_path)]).allowed_local_media_path
    with pytest.raises(CliError, match="--allowed-local-media-path .*: .*not a directory"):
        _settings(["--allowed-local-media-path", str(tmp_path / "missing")])
