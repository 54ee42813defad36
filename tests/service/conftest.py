"""Servers shared by the end-to-end test modules of one session."""

from __future__ import annotations

import json

import pytest

from engine.demo_model import ensure_demo_model
from tests.service.serve_process import server_pair

SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 4,
        "prompt_lookup_min": 2}


@pytest.fixture(scope="session")
def spec_servers():
    """(on, off): the demo model with SPEC (n-gram speculation) and without; 16 seqs."""
    model = ensure_demo_model()
    common = ("--max-model-len", "1024", "--max-num-seqs", "16", "--served-model-name",
              "demo", "--kv-cache-gib", "0.25")
    with server_pair(model, (*common, "--speculative-config", json.dumps(SPEC)),
                     common) as pair:
        yield pair
