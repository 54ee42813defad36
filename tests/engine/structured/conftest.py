"""Tokenizers for the grammar tests: the demo model's tokenizer.json (SmolLM2, ChatML) and a
tiny synth checkpoint's v13 tekken.json (published special ids, 1024 ids)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engine.demo_model import ensure_demo_model
from engine.text.tokenizer import Tokenizer
from tests.engine.structured.think_tokens import think_model_dir

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "enum": ["Paris", "Lyon"]},
        "unit": {"type": "string", "enum": ["C", "F"]}},
        "required": ["city", "unit"], "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "strict": True,
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"},
                                                    "b": {"type": "integer"}},
                   "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]

# what client.chat.completions.parse() sends for a pydantic model with a nested model,
# an Optional field, an enum and a list of lists
PARSE_SCHEMA = {
    "$defs": {
        "Address": {"type": "object", "title": "Address", "additionalProperties": False,
                    "properties": {"city": {"type": "string", "title": "City"},
                                   "zip": {"anyOf": [{"type": "string"}, {"type": "null"}],
                                           "title": "Zip"}},
                    "required": ["city", "zip"]},
        "Color": {"type": "string", "enum": ["red", "green", "blue"], "title": "Color"}},
    "type": "object", "title": "Person", "additionalProperties": False,
    "properties": {"name": {"type": "string", "title": "Name"},
                   "age": {"type": "integer", "title": "Age"},
                   "color": {"$ref": "#/$defs/Color"},
                   "home": {"$ref": "#/$defs/Address"},
                   "grid": {"type": "array", "title": "Grid",
                            "items": {"type": "array", "items": {"type": "integer"}}}},
    "required": ["name", "age", "color", "home", "grid"]}


@pytest.fixture(scope="session")
def demo_tokenizer() -> Tokenizer:
    """The demo model's tokenizer, found (or converted) where the rest of the suite finds it:
    under ``FP8SERVE_CACHE_DIR`` when set, as in CI."""
    return Tokenizer.from_dir(ensure_demo_model())


@pytest.fixture(scope="session")
def tekken_dir(tiny_checkpoint) -> Path:
    return tiny_checkpoint(tokenizer="tekken")


@pytest.fixture(scope="session")
def tekken_tokenizer(tekken_dir) -> Tokenizer:
    return Tokenizer.from_dir(tekken_dir)


@pytest.fixture(params=["hf", "tekken"])
def any_tokenizer(request) -> Tokenizer:
    return request.getfixturevalue("demo_tokenizer" if request.param == "hf"
                                   else "tekken_tokenizer")


@pytest.fixture(scope="session", params=[False, True], ids=["added", "special"])
def think_tokenizer(request, tmp_path_factory) -> Tokenizer:
    """The demo tokenizer with <think> / </think> as single added tokens (special or not)."""
    return Tokenizer.from_dir(think_model_dir(tmp_path_factory.mktemp("think"),
                                              special=request.param))
