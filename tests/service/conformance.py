"""The conformance matrix's servers and checks (tests/service/test_conformance_*.py): one
in-process server per checkpoint, driven by the official openai and anthropic SDKs.

Checkpoints: the demo model (ChatML, hermes calls); "published", a tiny random multimodal
checkpoint with the published file set (tokenizer.json with the Mistral specials at their
Tekken ids, the published 14B Instruct chat_template.jinja, tekken.json); "tekken", the
same model with tekken.json alone (mistral-common encodes the chat). Random weights never
close an open string, so every schema value is bounded (enum or maxLength), as real
clients often do; greedy decoding makes a stream and its non-streamed twin one answer."""

from __future__ import annotations

import base64
import io
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anthropic
import jsonschema
import numpy as np
import openai
from fastapi.testclient import TestClient
from PIL import Image

from engine.demo_model import ensure_demo_model
from engine.synth import SynthSpec, write_checkpoint
from engine.text.tokenizer import Tokenizer
from service.app import create_app
from service.settings import Settings

CHECKPOINTS = ("demo", "published", "tekken")
VISION = ("published", "tekken")
WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["Paris", "Rome", "Oslo"]},
    "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
CLOCK = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8}},
         "required": ["city"], "additionalProperties": False}
ANSWER = {"type": "object", "properties": {
    "city": {"type": "string", "enum": ["Paris", "Rome"]}, "sunny": {"type": "boolean"},
    "note": {"type": "string", "maxLength": 8}},
    "required": ["city", "sunny", "note"], "additionalProperties": False}
SCHEMAS = {"get_weather": WEATHER, "get_time": CLOCK}
CHAT_TOOLS = [{"type": "function", "function": {"name": name, "description": f"{name} of a city",
                                                "parameters": schema}}
              for name, schema in SCHEMAS.items()]
ASK = "What is the weather in Paris? Use the tools."
# The Mistral checkpoints read reasoning ([THINK] in the vocabulary), and under a constraint
# a reasoning model may reason first; random weights need not end their reasoning within a
# test's max_tokens. So the requests that test a constraint ask for no reasoning, as a
# client wanting the answer at once does (a no-op on the demo model, which has no reasoning
# parser); tests/service/test_e2e_reasoning_constraint.py tests reasoning before one.
CHAT_NO_REASONING = {"reasoning_effort": "none"}
MESSAGES_NO_THINKING = {"thinking": {"type": "disabled"}}
RESPONSES_NO_REASONING = {"reasoning": {"effort": "none"}}
RESULT = "18 degrees, sunny"


@dataclass
class Served:
    kind: str
    client: TestClient
    openai: openai.OpenAI
    anthropic: anthropic.Anthropic
    model: str
    tokenizer: Tokenizer  # the checkpoint's, loaded beside the server's


def checkpoint_dir(kind: str, root: Path) -> Path:
    """The demo model (cached under $FP8SERVE_CACHE_DIR) or a tiny multimodal checkpoint
    with the ``kind`` tokenizer files, written into ``root``."""
    if kind == "demo":
        return ensure_demo_model()
    write_checkpoint(root, SynthSpec.preset("tiny", layout="hf-multimodal", tokenizer=kind))
    return root


def start(kind: str, root: Path) -> Served:
    # the published template's default system prompt is ~1.5k tokens of a 1k vocabulary
    model_dir = checkpoint_dir(kind, root)
    settings = Settings(model=model_dir, max_model_len=4096, max_num_seqs=4,
                        kv_cache_gib=0.25)
    client = TestClient(create_app(settings))
    client.__enter__()
    oa = openai.OpenAI(base_url="http://testserver/v1", api_key="x", http_client=client,
                       max_retries=0)
    an = anthropic.Anthropic(base_url="http://testserver", api_key="x", http_client=client,
                             max_retries=0)
    return Served(kind, client, oa, an, oa.models.list().data[0].id,
                  Tokenizer.from_dir(model_dir))


def check_args(name: str, arguments: str | dict) -> None:
    """A call names an offered tool and its arguments are valid for that tool's schema."""
    assert name in SCHEMAS, name
    args = json.loads(arguments) if isinstance(arguments, str) else arguments
    jsonschema.validate(args, SCHEMAS[name])


def ok(raw: Any) -> Any:
    """An SDK ``with_raw_response`` call: HTTP 200, then the SDK's typed body."""
    assert raw.status_code == 200, raw.http_response.text
    return raw.parse()


def png_data_url(w: int = 56, h: int = 42, seed: int = 0) -> str:
    arr = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr, "RGB").save(buf, "PNG")
    return "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()


def chat_stream(s: Served, **kw: Any) -> dict[str, Any]:
    """A streamed chat completion reassembled as a client does: content, calls by index
    (name, arguments), finish_reason, completion tokens (the usage chunk)."""
    content, calls, reason, tokens = "", {}, None, None
    for chunk in s.openai.chat.completions.create(
            model=s.model, stream=True, stream_options={"include_usage": True}, **kw):
        if chunk.usage is not None:
            tokens = chunk.usage.completion_tokens
        for ch in chunk.choices:
            content += ch.delta.content or ""
            for d in ch.delta.tool_calls or ():
                call = calls.setdefault(d.index, {"name": "", "arguments": ""})
                call["name"] += (d.function and d.function.name) or ""
                call["arguments"] += (d.function and d.function.arguments) or ""
            reason = ch.finish_reason or reason
    return {"content": content or None, "calls": [calls[i] for i in sorted(calls)],
            "finish_reason": reason, "tokens": tokens}


def chat_answer(r: Any) -> dict[str, Any]:
    """The same fields of a non-streamed chat completion."""
    msg = r.choices[0].message
    calls = [{"name": c.function.name, "arguments": c.function.arguments}
             for c in msg.tool_calls or ()]
    return {"content": msg.content or None, "calls": calls,
            "finish_reason": r.choices[0].finish_reason, "tokens": r.usage.completion_tokens}


_SDK_ONLY = {"id", "call_id", "parsed", "parsed_arguments"}


def _plain(x):
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items() if k not in _SDK_ONLY}
    return [_plain(v) for v in x] if isinstance(x, list) else x


def final_response(events):
    """The response a Responses stream (or the list of its events) ends with:
    ``response.completed``'s, or ``response.incomplete``'s when max_output_tokens cut it
    (as OpenAI's API ends it; the openai SDK's get_final_response reads only the first)."""
    final = None
    for event in events:
        if event.type in ("response.completed", "response.incomplete"):
            final = event.response
    assert final is not None, "the stream ended without response.completed/incomplete"
    return final


def response_items(r) -> list:
    """A Responses answer's output items, ids aside (the stream and the body draw their
    own) and the stream helper's own ``parsed`` fields."""
    return [_plain(o.model_dump()) for o in r.output]
