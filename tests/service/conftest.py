"""Fixtures of the service tests: ``matrix``, one server per conformance checkpoint for
the whole session (tests/service/conformance.py), shared by the matrix's API files."""

from __future__ import annotations

import pytest

from tests.service.conformance import CHECKPOINTS, start


@pytest.fixture(scope="session", params=CHECKPOINTS)
def matrix(request, tmp_path_factory):
    s = start(request.param, tmp_path_factory.mktemp(f"conformance-{request.param}"))
    yield s
    s.client.__exit__(None, None, None)
