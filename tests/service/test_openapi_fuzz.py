"""The published contract holds: schemathesis generates requests from /openapi.json for
every operation (the real app over the fake backend) and checks the answers: no 5xx, only
documented status codes and content types, bodies matching their schemas, schema-valid
requests accepted and schema-invalid ones rejected with a 4xx.

A schema-valid request that gets a 400 passes only when its operation documents that
rejection (the rules in its 400 response, service/rejections.py: the model's vocabulary
and context, rules across fields or messages, a signature); any other 400 for one fails,
as does any 5xx. Bounded and derandomized: the same cases on every run. A deeper local
run: FP8SERVE_FUZZ_EXAMPLES=300, and FP8SERVE_FUZZ_PHASES=coverage,fuzzing adds
schemathesis' boundary-value cases (~40 s more)."""

from __future__ import annotations

import os

import pytest
import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)

from service.app import create_app
from service.openapi import RULES_KEY
from service.rejections import Rule
from service.settings import Settings
from tests.engine.fake_runner import VOCAB
from tests.service.fake_backend import MODEL, fake_loader

MAX_EXAMPLES = int(os.environ.get("FP8SERVE_FUZZ_EXAMPLES", "40"))
PHASES = os.environ.get("FP8SERVE_FUZZ_PHASES", "fuzzing").split(",")
# a small queue: a drawn n=32 over 14 prompts is a 429 (documented), not 448 generations
SETTINGS = Settings(max_model_len=64, max_num_seqs=4, max_queue=64)
app = create_app(SETTINGS, load_backend=fake_loader())
schema = schemathesis.openapi.from_asgi("/openapi.json", app)
schema.config.phases.update(phases=PHASES)
schema.config.generation.update(
    modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE],
    max_examples=MAX_EXAMPLES, deterministic=True)

CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance,
          response_schema_conformance, positive_data_acceptance, negative_data_rejection]

DOC = app.openapi()


def rules_of(case) -> list[Rule]:
    """The 400 rules /openapi.json documents for the case's operation."""
    op = DOC["paths"][case.operation.path][case.operation.method.lower()]
    return [Rule(r["param"], r["message"], r["rule"])
            for r in op["responses"].get("400", {}).get(RULES_KEY, [])]


def named_field(response) -> tuple[str, str]:
    """(the field a 400 names, its message): OpenAI's param; Anthropic's shape has no
    param, its message starts with the field."""
    body = response.json()
    message = body["error"]["message"]
    if body.get("type") == "error":
        return message.split(":", 1)[0], message
    return body["error"]["param"] or "", message


def check_rejection(case, response) -> bool:
    """True for a 400 on a schema-valid request, which must be one its operation
    documents; False for any other answer."""
    if response.status_code != 400 or not case.meta.generation.mode.is_positive:
        return False
    param, message = named_field(response)
    assert any(r.matches(param, message) for r in rules_of(case)), (
        f"{case.operation.label}: a schema-valid request got a 400 its operation does not "
        f"document: {response.text}\nrequest: {case.body!r}")
    return True


def _fold(value):
    """Token ids (ints, or integral floats: JSON numbers) into the fake vocabulary."""
    if isinstance(value, list):
        return [_fold(v) for v in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return int(value) % VOCAB
    return value


def fit_the_model(case) -> None:
    """Schema-valid requests aimed at what the fake model serves, so most get past the
    model-dependent checks into generation: the served model name (any other is a 404),
    token ids inside its 50-token vocabulary."""
    if not case.meta.generation.mode.is_positive or not isinstance(case.body, dict):
        return
    body = dict(case.body)
    if isinstance(body.get("model"), str):
        body["model"] = MODEL
    for name in ("prompt", "tokens", "stop_token_ids"):
        if isinstance(body.get(name), list):
            body[name] = _fold(body[name])
    if isinstance(body.get("logit_bias"), dict):
        body["logit_bias"] = {str(int(k) % VOCAB): v for k, v in body["logit_bias"].items()}
    case.body = body


@pytest.fixture(scope="module", autouse=True)
def _stop_app():
    yield
    schemathesis.python.asgi.shutdown_lifespans()


@schema.parametrize()
@settings(max_examples=MAX_EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
def test_contract(case):
    fit_the_model(case)
    response = case.call(timeout=60)
    excluded = [positive_data_acceptance] if check_rejection(case, response) else []
    case.validate_response(response, checks=CHECKS, excluded_checks=excluded)
