"""vLLM's ``structured_outputs`` on /v1/completions and /v1/chat/completions: the request's
constraint as a spec (engine/structured/outputs.py), with every refusal a 400 naming the
field the client sent.

The fields vLLM had before (``guided_json``, ``guided_regex``, ``guided_choice``,
``guided_grammar``, ``guided_whitespace_pattern``, ``structural_tag``; removed in vLLM
0.12, still sent by older clients) are read as the same constraint rather than ignored.
``guided_decoding_backend`` chose vLLM's backend: this server has one (llguidance), so
only the values that name it or leave the choice open are accepted.
"""

from __future__ import annotations

from typing import Any

from engine.structured import (
    GrammarError,
    GrammarSpec,
    spec_from_response_format,
    spec_from_structured_outputs,
)
from service.errors import APIError

FIELD = "structured_outputs"
# the older top-level fields -> their key in structured_outputs
LEGACY = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice",
          "guided_grammar": "grammar", "guided_whitespace_pattern": "whitespace_pattern",
          "structural_tag": "structural_tag"}
BACKENDS = ("auto", "guidance", "llguidance")


def _check_backend(body: Any) -> None:
    backend = body.guided_decoding_backend
    if backend is not None and backend.split(":", 1)[0] not in BACKENDS:
        raise APIError(400, f"guided_decoding_backend: {backend!r} is not available; this "
                       f"server's one backend is llguidance (accepted: "
                       f"{', '.join(BACKENDS)}; or leave it out)", "guided_decoding_backend")


def requested(body: Any) -> tuple[str, dict[str, Any]] | None:
    """(the field the constraint came in, structured_outputs as a dict), or None when
    the request constrains nothing this way. ``body``: a completions or chat request."""
    _check_backend(body)
    legacy = {name: getattr(body, name) for name in LEGACY if getattr(body, name) is not None}
    if body.structured_outputs is not None:
        if legacy:
            name = next(iter(legacy))
            raise APIError(400, f"{name}: cannot be combined with {FIELD} (it is its older "
                           f"form; send one of them)", name)
        return FIELD, body.structured_outputs.as_params()
    if not legacy:
        return None
    constraints = [n for n in legacy if n != "guided_whitespace_pattern"]
    param = constraints[0] if len(constraints) == 1 else next(iter(legacy))
    return param, {LEGACY[n]: v for n, v in legacy.items()}


def structured_spec(body: Any) -> tuple[str, GrammarSpec] | None:
    """(the field, its spec), or None; a malformed or refused constraint is a 400 naming
    the field."""
    got = requested(body)
    if got is None:
        return None
    param, params = got
    try:
        return param, spec_from_structured_outputs(params)
    except GrammarError as exc:
        raise APIError(400, f"{param}: invalid constraint: {exc}", param) from exc


def completion_constraint(body: Any) -> tuple[str, GrammarSpec] | None:
    """A completions request's constraint: structured_outputs (or a guided_* field), or
    vLLM's response_format (json_object / json_schema) there; not both."""
    got = structured_spec(body)
    rf = body.response_format
    if rf is None or rf.type == "text":
        return got
    if got is not None:
        raise APIError(400, f"{got[0]}: cannot be combined with response_format (both "
                       "constrain the whole output; send one)", got[0])
    try:
        spec = spec_from_response_format(rf.model_dump(by_alias=True, exclude_none=True))
    except GrammarError as exc:
        raise APIError(400, f"response_format: invalid constraint: {exc}",
                       "response_format") from exc
    return "response_format", spec


def compile_spec(backend: Any, param: str, spec: GrammarSpec) -> Any:
    """The compiled grammar (CPU work: call through a thread pool); a grammar llguidance
    rejects is a 400 naming ``param``."""
    try:
        return backend.grammar_compiler.compile(spec)
    except GrammarError as exc:
        raise APIError(400, f"{param}: cannot be enforced as a grammar: {exc}", param) from exc
