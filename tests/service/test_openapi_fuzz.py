"""The published contract holds: schemathesis generates requests from /openapi.json for
every operation (the real app over the fake backend) and checks the answers: no 5xx, only
documented status codes and content types, bodies matching their schemas, schema-valid
requests accepted and schema-invalid ones rejected with a 4xx.

A few 400s depend on the model, on several fields at once or on what a content part holds,
which this JSON schema does not say; SCHEMALESS_400S lists them. Bounded and derandomized:
the same cases on every run. A deeper local run: FP8SERVE_FUZZ_EXAMPLES=300, and
FP8SERVE_FUZZ_PHASES=coverage,fuzzing adds schemathesis' boundary-value cases (~40 s more)."""

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

# (param, words in the message): 400s a schema-valid request can get
SCHEMALESS_400S = [
    ("max_tokens", "max_model_len"),  # prompt + max_tokens must fit the model's context
    ("messages", "max_model_len"), ("prompt", "max_model_len"),
    ("min_tokens", "exceeds max_tokens"),  # two fields together
    ("logit_bias", "out of range for vocab"), ("stop_token_ids", "out of range for vocab"),
    ("prompt", "out of range"), ("tokens", "out of range"),  # ids past the vocabulary
    ("prompt", "empty"), ("messages", "empty"),  # text that encodes to no tokens
    ("messages", "content part"), ("messages", "does not take images"),  # no vision tower
    # tool turns: rules across messages (a result answers an earlier call)
    ("messages[", "needs tool_call_id"), ("messages[", "answers no tool call"),
    ("messages[", "only assistant messages carry tool_calls"),
    ("messages[", "image parts are accepted in user messages only"),  # a role's parts
    ("messages", "is not valid JSON"),  # a call's arguments text
    # tools and tool_choice together
    ("tool_choice", "needs tools"), ("tool_choice", "not among the tools"),
    ("tools", "given twice"), ("response_format", "cannot be combined"),
    ("tools", "no tool-call format"),  # the model's: this fake one has no parser
    ("response_format", "does not support this tokenizer"),  # nor a grammar vocabulary
    # Anthropic's messages: which blocks a role carries, a named tool choice's name, thinking
    # on a model without a reasoning parser, a budget against max_tokens
    ("messages", "cannot carry"), ("tool_choice.name", "needs a name"),
    ("thinking", "no reasoning format"), ("thinking.budget_tokens", "less than max_tokens"),
    ("input", "no message to answer"),  # Responses input of reasoning items only
    # a thinking block whose signature does not verify (service/translate/signature.py)
    ("messages.", "invalid signature in thinking block"),
    # reasoning caps (service/tool_calls/thinking.py): a budget needs a reasoning parser
    # whose markers are single tokens; efforts other than none and summaries are not served
    ("thinking_token_budget", "no reasoning format"), ("thinking", "not single tokens"),
    ("thinking_token_budget", "not single tokens"), ("reasoning.effort", "not single tokens"),
    ("reasoning_effort", "is not supported"), ("reasoning.effort", "is not supported"),
    ("reasoning.summary", "is not supported"), ("reasoning.generate_summary", "not supported"),
]


def documented_400(response) -> bool:
    if response.status_code != 400:
        return False
    err = response.json()["error"]
    message = err["message"]
    # Anthropic's shape has no param: its messages start with it
    param = err["param"] or "" if "param" in err else message.split(":", 1)[0]
    return any(param.startswith(p) and words in message for p, words in SCHEMALESS_400S)


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
    excluded = [positive_data_acceptance] if documented_400(response) else []
    case.validate_response(response, checks=CHECKS, excluded_checks=excluded)
