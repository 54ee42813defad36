"""generation_config.json sampling defaults: which keys count, their types, and a bad
value failing at load with the file and key named."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from engine.checkpoint.errors import CheckpointError
from engine.checkpoint.generation import SamplingDefaults, sampling_defaults


def write(tmp_path: Path, gen: dict) -> Path:
    (tmp_path / "generation_config.json").write_text(json.dumps(gen))
    return tmp_path


def test_reads_the_sampling_keys_only(tmp_path) -> None:
    d = sampling_defaults(write(tmp_path, {
        "bos_token_id": 1, "eos_token_id": 2, "do_sample": True, "temperature": 0.15,
        "top_p": 0.9, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1,
        "max_new_tokens": 300, "num_beams": 1}))
    assert d == SamplingDefaults(temperature=0.15, top_p=0.9, top_k=40, min_p=0.05,
                                 repetition_penalty=1.1, max_tokens=300)
    assert isinstance(d.temperature, float) and isinstance(d.top_k, int)


def test_absent_file_or_keys_give_no_defaults(tmp_path) -> None:
    assert sampling_defaults(tmp_path).as_dict() == {}
    assert sampling_defaults(write(tmp_path, {"eos_token_id": 2, "temperature": None})) \
        == SamplingDefaults()
    assert sampling_defaults(write(tmp_path, {"temperature": 1})).temperature == 1.0


@pytest.mark.parametrize("gen,why", [
    ({"temperature": "0.7"}, "temperature must be a number"),
    ({"top_k": 4.5}, "top_k must be an integer"),
    ({"max_new_tokens": True}, "max_new_tokens must be an integer"),
    ({"top_p": 1.5}, "top_p"),
    ({"temperature": -1.0}, "temperature"),
    ({"max_new_tokens": 0}, "max_tokens"),
])
def test_bad_values_fail_naming_file_and_key(tmp_path, gen, why) -> None:
    with pytest.raises(CheckpointError, match=why) as err:
        sampling_defaults(write(tmp_path, gen))
    assert "generation_config.json" in str(err.value)
