"""--speculative-config parsing (engine/spec/config.py)."""

import pytest

from engine.config import ConfigError
from engine.spec.config import DEFAULT_LOOKUP, SpeculativeConfig


def test_vllm_keys_and_defaults():
    c = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 4, '
                                '"prompt_lookup_max": 3}')
    assert (c.num_speculative_tokens, c.prompt_lookup_max, c.prompt_lookup_min) == (4, 3, 3)
    c = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 2, '
                                '"prompt_lookup_min": 2}')
    assert (c.prompt_lookup_min, c.prompt_lookup_max) == (2, 2)
    c = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 2}')
    assert c.prompt_lookup_min == c.prompt_lookup_max == DEFAULT_LOOKUP
    assert SpeculativeConfig.parse(c.to_json()) == c
    assert SpeculativeConfig.parse(None) is None and SpeculativeConfig.parse("  ") is None
    assert SpeculativeConfig.parse("null") is None


@pytest.mark.parametrize(("text", "names"), [
    ("{", "not valid JSON"),
    ("[1]", "JSON object"),
    ('{"method": "eagle", "num_speculative_tokens": 2}', "method"),
    ('{"method": "ngram"}', "num_speculative_tokens"),
    ('{"num_speculative_tokens": 2}', "method"),
    ('{"method": "ngram", "num_speculative_tokens": 0}', "num_speculative_tokens"),
    ('{"method": "ngram", "num_speculative_tokens": true}', "num_speculative_tokens"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 4, '
     '"prompt_lookup_max": 2}', "prompt_lookup_min"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "model": "x"}', "'model'"),
    ('{"method": "ngram", "num_speculative_tokens": 2, "disable_by_batch_size": 0}',
     "disable_by_batch_size"),
])
def test_bad_configs_name_the_key(text, names):
    with pytest.raises(ConfigError, match=names):
        SpeculativeConfig.parse(text)
