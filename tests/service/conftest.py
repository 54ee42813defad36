"""Servers shared by the end-to-end test modules of one session: ``spec_servers`` (the
demo model with and without n-gram speculation) and ``matrix``, one server per
conformance checkpoint (tests/service/conformance.py), shared by the matrix's API files."""

from __future__ import annotations

import json

import pytest

from engine.demo_model import ensure_demo_model
from tests.service.conformance import CHECKPOINTS, start
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


@pytest.fixture(scope="session", params=CHECKPOINTS)
def matrix(request, tmp_path_factory):
    s = start(request.param, tmp_path_factory.mktemp(f"conformance-{request.param}"))
    yield s
    s.client.__exit__(None, None, None)
