"""Operator routes: /health, /ping and /metrics (no API key), /kernels, /version, /tokenize,
/detokenize, /reset_prefix_cache (API key when configured)."""

from __future__ import annotations

import json
from typing import Any

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.concurrency import run_in_threadpool

from service import rejections
from service.deps import ReadyStateDep, StateDep, check_model, require_api_key
from service.errors import APIError
from service.fingerprint import package_version
from service.images import encode_chat_prompt
from service.openapi import errors, ok
from service.prompts import (
    OVERSIZE_TEXT_FACTOR,
    _check_ids,
    chat_text_chars,
    check_text_fits,
)
from service.schemas import DetokenizeRequest, TokenizeRequest
from service.tool_calls.plan import plan_chat

public = APIRouter()
private = APIRouter(dependencies=[Depends(require_api_key)])


_HEALTH = {**ok("Health"), **ok("Health", status=503, description="loading, draining or dead")}


@public.get("/health", response_model=None, responses=_HEALTH)
async def health(state: StateDep) -> JSONResponse:
    status = state.status
    body: dict[str, Any] = {"status": status}
    if status == "dead" and state.engine is not None:
        body["error"] = state.engine.death
    if state.engine is not None:
        s = state.engine.stats()
        body.update(running=s.num_running, waiting=s.num_waiting)
    return JSONResponse(body, 200 if status == "ready" else 503)


@public.get("/ping", response_model=None, responses=_HEALTH)
@public.post("/ping", response_model=None, responses=_HEALTH)
async def ping(state: StateDep) -> JSONResponse:
    """vLLM's (SageMaker's) liveness route: /health's answer."""
    return await health(state)


@public.get("/metrics", response_class=Response, responses={
    200: {"description": "Prometheus text format", "content": {CONTENT_TYPE_LATEST: {}}},
    **errors(503)})
async def metrics(state: StateDep) -> Response:
    if state.registry is None:
        raise APIError(503, "model is still loading", code="loading")
    return Response(generate_latest(state.registry), media_type=CONTENT_TYPE_LATEST)


@private.get("/kernels", responses=errors(401, 503))
async def kernels(state: ReadyStateDep) -> dict[str, Any]:
    return state.kernels_body()


@private.get("/version", responses=errors(401))
async def version(state: StateDep) -> dict[str, Any]:
    import torch
    body: dict[str, Any] = {"version": package_version(), "torch": torch.__version__}
    if state.backend is not None:
        body["model"] = state.backend.model_name
        body.update(state.parsers.as_dict())
        spec = getattr(state.backend.engine_config, "speculative_config", None)
        body["speculative_config"] = None if spec is None else json.loads(spec.to_json())
    return body


@private.post("/reset_prefix_cache", responses=errors(401, 503))
async def reset_prefix_cache(state: ReadyStateDep) -> dict[str, Any]:
    """Drop every cached KV block (vLLM's route): later requests compute their prompts
    again. Blocks that running requests hold stay theirs."""
    enabled = state.backend.engine_config.enable_prefix_caching
    dropped = await run_in_threadpool(state.engine.reset_prefix_cache) if enabled else 0
    return {"enabled": enabled, "num_blocks_dropped": dropped}


def _refuse_chat_options(body: TokenizeRequest) -> None:
    """A 400 naming a chat option sent beside ``prompt`` (null or its default: none)."""
    for name in rejections.TOKENIZE_CHAT_OPTIONS:
        value = getattr(body, name)
        if value is not None and value != TokenizeRequest.model_fields[name].default:
            raise APIError(400, f"{name}: renders messages, and this request tokenizes a "
                           "prompt; send messages, or leave it out", name)


@private.post("/tokenize", response_model=None,
              responses={**ok("Tokens"),
                         **errors(400, 401, 404, 503, rules=rejections.TOKENIZE)})
async def tokenize(body: TokenizeRequest, state: ReadyStateDep) -> Response:
    check_model(state, body.model)
    tok = state.backend.tokenizer
    if (body.prompt is None) == (body.messages is None):
        raise APIError(400, "give exactly one of prompt or messages", "prompt")
    if body.prompt is not None:
        _refuse_chat_options(body)
        check_text_fits(state, len(body.prompt), "prompt", OVERSIZE_TEXT_FACTOR)
        special = body.add_special_tokens is not False
        ids = await run_in_threadpool(tok.encode, body.prompt, special)
    else:
        check_text_fits(state, chat_text_chars(body.messages), "messages",
                        OVERSIZE_TEXT_FACTOR)
        chat = body.chat_request()
        # as a chat request's prompt: images expanded to their tokens (count_tokens too)
        ids, _ = await run_in_threadpool(encode_chat_prompt, state, body.messages,
                                         body.add_generation_prompt,
                                         plan_chat(chat, state.parsers))

    def answer() -> JSONResponse:
        out: dict[str, Any] = {"tokens": ids, "count": len(ids),
                               "max_model_len": state.settings.max_model_len}
        if body.return_token_strs:
            out["token_strs"] = [tok.id_to_token(i) for i in ids]
        return JSONResponse(out)

    # built and serialized off the event loop: a text of megabytes is millions of ids,
    # a second and more of work that held every other request (/health among them)
    return await run_in_threadpool(answer)


@private.post("/detokenize", response_model=None,
              responses={**ok("Text"),
                         **errors(400, 401, 404, 503, rules=rejections.DETOKENIZE)})
async def detokenize(body: DetokenizeRequest, state: ReadyStateDep) -> dict[str, Any]:
    check_model(state, body.model)
    ids = _check_ids(state, body.tokens, "tokens") if body.tokens else []
    text = await run_in_threadpool(state.backend.tokenizer.decode, ids, False)
    return {"prompt": text}
