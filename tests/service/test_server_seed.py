"""vLLM's --seed: the random state that requests without a seed of their own sample from
starts at it when the engine starts, so a server started twice with one seed answers the
same unseeded requests, sent in the same order, the same way; another seed, another
answer; a request's own seed does not depend on it."""

from __future__ import annotations

from fastapi.testclient import TestClient

from cli.main import build_parser
from cli.serve import settings_from_args
from engine.demo_model import ensure_demo_model
from service.app import create_app
from service.settings import Settings

ASK = [{"prompt": "Once upon a time", "max_tokens": 16, "temperature": 1.0},
       {"prompt": "The weather today", "max_tokens": 16, "temperature": 1.0},
       {"prompt": "Once upon a time", "max_tokens": 16, "temperature": 1.0, "seed": 3}]


def answers(seed: int | None) -> list[str]:
    settings = Settings(model=ensure_demo_model(), max_model_len=256, kv_cache_gib=0.05,
                        seed=seed)
    with TestClient(create_app(settings)) as c:
        return [c.post("/v1/completions", json=body).json()["choices"][0]["text"]
                for body in ASK]


def test_one_seed_repeats_the_unseeded_answers_and_another_does_not():
    first, again, other = answers(7), answers(7), answers(8)
    assert first == again
    assert first[:2] != other[:2]  # 32 tokens sampled at temperature 1
    assert first[2] == other[2]  # the request's own seed rules its answer


def test_the_flag_and_the_environment(monkeypatch):
    args = build_parser().parse_args(["serve", "--seed", "42"])
    assert settings_from_args(args).seed == 42
    monkeypatch.setenv("FP8SERVE_SEED", "5")
    assert Settings().seed == 5
