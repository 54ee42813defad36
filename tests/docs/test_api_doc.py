"""docs/api.md's field tables are generated from the request models and
service/unsupported.py: they must be current, and each route's table must name every
field the model declares and every field unsupported.py classifies for its endpoint."""

import re

import pytest

from cli.docgen import API
from cli.docgen.api_doc import REGION, render_api, routes
from service import unsupported

# unsupported.py's endpoint -> the docs/api.md region whose table lists its fields
REGION_OF = {unsupported.COMPLETIONS: "/v1/completions", unsupported.CHAT: "/v1/chat/completions",
             unsupported.MESSAGES: "/v1/messages",
             unsupported.COUNT_TOKENS: "/v1/messages/count_tokens",
             unsupported.RESPONSES: "/v1/responses", unsupported.STREAM_OPTIONS: "objects"}


def regions() -> dict[str, str]:
    return {m.group("key"): m.group(0) for m in REGION.finditer(API.read_text("utf-8"))}


def table_fields(text: str) -> set[str]:
    return set(re.findall(r"^\| `([^`]+)` \|", text, re.M))


def test_the_api_doc_is_current():
    text = API.read_text(encoding="utf-8")
    assert render_api(text) == text, "docs/api.md is stale: run python -m cli.docgen"


def test_every_field_unsupported_py_names_is_in_its_routes_table():
    found = regions()
    for endpoint, key in REGION_OF.items():
        named = (set(unsupported.IMPLEMENTED.get(endpoint, ())) | set(unsupported.NOOP[endpoint])
                 | set(unsupported.HINTS[endpoint]))
        missing = named - table_fields(found[key])
        assert not missing, f"{endpoint}: {sorted(missing)} not in docs/api.md"


def test_every_request_field_is_in_its_routes_table():
    found = regions()
    bodies = [(path, body) for _, path, _, body in routes() if body is not None]
    assert len(bodies) == 12  # conversations: 3, a stored chat completion's metadata: 1
    for path, body in bodies:
        declared = {f.alias or name for name, f in body.model_fields.items()}
        missing = declared - table_fields(found[path])
        assert not missing, f"{path}: {sorted(missing)} not in docs/api.md"


def test_every_route_is_listed():
    listed = regions()["routes"]
    for method, path, _, _ in routes():
        assert f"`{method} {path}`" in listed


def test_a_route_without_its_region_is_an_error():
    text = API.read_text(encoding="utf-8")
    cut = re.sub(r"<!-- generated: /v1/responses -->.*?<!-- end generated -->", "", text,
                 flags=re.S)
    with pytest.raises(ValueError, match="/v1/responses"):
        render_api(cut)


def test_every_hint_is_labelled_accepted_and_ignored():
    """A hint unsupported.py ignores reads so in its table, also where the request model
    declares it (`user` on completions and chat completions)."""
    found = regions()
    for endpoint, key in REGION_OF.items():
        for name in unsupported.HINTS[endpoint] | unsupported.VLLM_HINTS.get(endpoint, set()):
            rows = re.findall(rf"^\| `{re.escape(name)}` \|.*\| ([^|]+) \|$", found[key], re.M)
            assert rows and all(r.strip() == "accepted and ignored" for r in rows), (
                endpoint, name, rows)


def _metrics_section() -> str:
    text = API.read_text(encoding="utf-8")
    return text[text.index("\n## Metrics\n"):text.index("\n## Objects in request bodies\n")]


def test_every_metric_and_label_is_in_the_metrics_section():
    """Each family a scrape exports (vision's among them) is named in docs/api.md's Metrics
    section with every label but model_name (named once, for all): `name{a,b}`, or a
    `prefix_*` for families described together. requests_aborted/_timed_out/_failed and
    the spec_decode counters' grammar label were missing."""
    from types import SimpleNamespace

    from prometheus_client import generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from engine.request import FinishReason
    from service.backend import ServingState
    from service.metrics import build_registry
    from service.settings import Settings
    from service.vision_metrics import VisionMetrics
    from tests.deploy.test_monitoring import REPORT

    stats = SimpleNamespace(num_running=1, num_waiting=2, kv_cache_usage=0.5)
    registry, metrics = build_registry("m", lambda: stats, lambda: {**REPORT, "attention": {
        "path": "paged", "reason": None}}, {"avx2": True}, {"built": "true"},
        ServingState(Settings()).store_stats)
    VisionMetrics(registry, "m").on_image(0.5, 64, cached=False)
    metrics.on_rejected("QueueFullError")
    metrics.on_spec_decode(3, 2, "json_schema")
    metrics.on_finished(FinishReason.ABORT, 1.0, 2, "chat")
    section = _metrics_section()
    named = {m.group(1): set(filter(None, (m.group(2) or "").split(",")))
             for m in re.finditer(r"`([a-z0-9_]+\*?)(?:\{([a-z_,]*)\})?`", section)}
    families = list(text_string_to_metric_families(generate_latest(registry).decode()))
    assert len(families) > 40
    for fam in families:
        if fam.name.endswith("_created"):  # prometheus_client's creation times
            continue
        name = fam.name.removeprefix("fp8serve_")
        shown = name + ("_total" if fam.type == "counter" else "")
        labels = {k for s in fam.samples for k in s.labels} - {"model_name", "le"}
        doc = named.get(shown)
        if doc is None:
            doc = next((named[p] for p in named if p.endswith("*")
                        and shown.startswith(p[:-1])), None)
        assert doc is not None, f"{shown} not in docs/api.md's Metrics section"
        assert labels <= doc, (shown, sorted(labels - doc))
