"""POST /v1/completions, POST /v1/chat/completions, GET /v1/models."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from engine.stream import RequestOutput
from engine.text.chat_template import content_text
from service import rejections
from service.backend import ServingState
from service.beam_search import BeamSubmission, beam_request, check_beam_fields
from service.best_of import best_choices, check_best_of
from service.chat_run import make_params, start_chat
from service.collect import Choice, collect, threaded_json
from service.deps import (
    ReadyStateDep,
    check_model,
    refuse_other_query,
    require_api_key,
    served_names,
)
from service.errors import APIError, not_json_message
from service.fingerprint import system_fingerprint
from service.generation import Choices, submit
from service.openai_format import Formatter, usage
from service.openapi import errors, ok
from service.prompt_echo import prompt_only_choice, prompt_only_output
from service.prompts import encode_prompts
from service.routers.stored_chat import check_store, keep
from service.schemas import ChatCompletionRequest, CompletionRequest
from service.sse import stream_events
from service.structured_outputs import compile_spec, completion_constraint

router = APIRouter(dependencies=[Depends(require_api_key)])
SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


def token_text(state: ServingState):
    tok = state.backend.tokenizer
    return getattr(tok, "token_to_text", lambda i: tok.decode([i], False))


def token_bytes(state: ServingState):
    """The tokenizer's token_bytes (None: the token text's UTF-8, for tokenizers without)."""
    return getattr(state.backend.tokenizer, "token_bytes", None)


def shown_text(state: ServingState):
    """A generated token's text as skip_special_tokens shows it (a special token's: "")."""
    tok = state.backend.tokenizer
    return lambda i: tok.decode([i], skip_special_tokens=True)


def token_id_text(token_id: int) -> str:
    """vLLM's return_tokens_as_token_ids: a token named by its id."""
    return f"token_id:{token_id}"


def formatter(state: ServingState, rid: str, model: str,
              body: CompletionRequest | ChatCompletionRequest) -> Formatter:
    """The request's Formatter: logprobs name tokens by their text and bytes, or with
    return_tokens_as_token_ids as "token_id:<id>" (bytes: that name's UTF-8, as vLLM's);
    prompt_logprobs' decoded_token is the text either way. text_offset counts a generated
    special token as the answer's text shows it: nothing, with skip_special_tokens."""
    text = token_text(state)
    skipped = shown_text(state)
    shown = skipped if body.skip_special_tokens else None

    def special(i: int) -> bool:
        return not skipped(i) and bool(text(i))

    head = {"fingerprint": system_fingerprint(state),
            "null_usage": bool(body.stream and body.include_usage)}
    if body.return_tokens_as_token_ids:
        return Formatter(rid, model, token_id_text, None, decoded_of=text,
                         own_bytes=token_bytes(state), shown_of=shown, special=special,
                         **head)
    return Formatter(rid, model, text, token_bytes(state), shown_of=shown, special=special,
                     **head)


def check_prompt_logprobs(body: CompletionRequest | ChatCompletionRequest) -> None:
    """vLLM's prompt_logprobs come with the whole answer only, as vLLM's do."""
    if body.stream and body.prompt_logprobs is not None:
        raise APIError(400, "prompt_logprobs: not available when stream is true (send the "
                       "request without streaming)", "prompt_logprobs")


def prompt_text(state: ServingState, prompt: list[int]) -> str:
    """vLLM's return_prompt_text: the ids the model read, as text (nothing skipped)."""
    return state.backend.tokenizer.decode(prompt, skip_special_tokens=False)


def chat_echo(body: ChatCompletionRequest) -> str:
    """vLLM's ``echo`` on chat: the final message's text (its text parts joined, as the
    template reads them) when that message is the assistant's, the role of the answer,
    which then starts with it; with continue_final_message the answer is the whole message.
    A final message of another role has nothing of the answer's to echo: ""."""
    last = body.messages[-1]
    if not body.echo or last.role != "assistant":
        return ""
    return content_text(last.content)


def prepend_echo(answer: dict[str, Any], echo: str) -> dict[str, Any]:
    """``answer`` (a chat.completion) with each message's content starting with ``echo``."""
    if echo:
        for choice in answer["choices"]:
            message = choice["message"]
            message["content"] = echo + (message.get("content") or "")
    return answer


def model_card(state: ServingState, name: str) -> dict[str, Any]:
    """One card both APIs read: OpenAI's model (id, object, created, owned_by, with
    vLLM's max_model_len) and Anthropic's ModelInfo (type, display_name, created_at,
    lifecycle, max_input_tokens, max_tokens)."""
    limit = state.settings.max_model_len
    started = datetime.fromtimestamp(int(state.started), UTC)
    return {"id": name, "object": "model", "created": int(state.started),
            "owned_by": "fp8serve", "max_model_len": limit,
            "input_modalities": (["text", "image"] if getattr(state.backend, "vision", None)
                                 else ["text"]),
            "type": "model", "display_name": name,
            "created_at": started.isoformat().replace("+00:00", "Z"),
            "lifecycle": "active", "max_input_tokens": limit - 1, "max_tokens": limit - 1}


@router.get("/v1/models", response_model=None,
            responses={**ok("ModelList"), **errors(400, 401, 503, rules=rejections.MODELS)})
async def models(request: Request, state: ReadyStateDep,
                 limit: Annotated[int, Query(ge=1, le=1000)] = 20,
                 after_id: str | None = None, before_id: str | None = None
                 ) -> dict[str, Any]:
    """A card for each served name (the first is the model's own): OpenAI's list, which
    is also Anthropic's page (has_more, first_id, last_id; Anthropic's clients page with
    limit, after_id and before_id)."""
    refuse_other_query(request, dict.fromkeys(("limit", "after_id", "before_id")),
                       "the model list pages with limit, after_id and before_id")
    names = served_names(state)
    if after_id is not None and before_id is not None:
        raise APIError(400, "before_id: send after_id or before_id, not both", "before_id")
    for param, cursor in (("after_id", after_id), ("before_id", before_id)):
        if cursor is not None and cursor not in names:
            raise APIError(400, f"{param}: {cursor!r} is not a served model", param)
    if before_id is not None:
        names = names[:names.index(before_id)]
        names, more = names[-limit:], len(names) > limit
    else:
        if after_id is not None:
            names = names[names.index(after_id) + 1:]
        names, more = names[:limit], len(names) > limit
    return {"object": "list", "data": [model_card(state, n) for n in names],
            "has_more": more, "first_id": names[0] if names else None,
            "last_id": names[-1] if names else None}


@router.get("/v1/models/{model:path}", response_model=None,
            responses={**ok("Model"), **errors(400, 401, 404, 503,
                                               rules=rejections.NO_QUERY)})
async def model(model: str, request: Request, state: ReadyStateDep) -> dict[str, Any]:
    """OpenAI's retrieve model: the served model's card (the id may hold slashes)."""
    refuse_other_query(request, {}, "this route takes no query parameter")
    return model_card(state, check_model(state, model))


@router.post("/v1/completions", response_model=None, responses={
    **ok("Completion", chunk="CompletionChunk"),
    **errors(400, 401, 404, 408, 429, 503, rules=rejections.COMPLETIONS)})
async def completions(body: CompletionRequest, request: Request, state: ReadyStateDep):
    model = check_model(state, body.model)
    check_prompt_logprobs(body)
    constraint = completion_constraint(body)
    if body.use_beam_search:
        check_beam_fields(body, constraint[0] if constraint else None, body.best_of)
        if body.echo and body.logprobs is not None:
            raise APIError(400, "echo: with logprobs, echo returns the prompt's logprobs, "
                           "which use_beam_search does not compute", "echo")
    best_of = check_best_of(state, body)
    grammar = (None if constraint is None
               else await run_in_threadpool(compile_spec, state.backend, *constraint))
    prompts, texts = await run_in_threadpool(encode_prompts, state, body.prompt,
                                             body.add_special_tokens,
                                             body.truncate_prompt_tokens)
    echo_lps = body.echo and body.logprobs is not None  # prompt logprobs are computed
    wanted = [k for k in (body.logprobs if echo_lps else None, body.prompt_logprobs)
              if k is not None]
    # best_of ranks candidates by their tokens' logprobs: computed even when not shown
    ranked = body.logprobs if best_of == body.n else (body.logprobs or 0)
    params = await run_in_threadpool(make_params, state, body, ranked,
                                     max(wanted) if wanted else None, grammar)
    if body.use_beam_search:
        sub: Choices = BeamSubmission(
            state, "cmpl", prompts, beam_request(state, body, params, body.logprobs),
            body.cache_salt, priority=body.priority)
    else:
        sub = submit(state, "cmpl", prompts, params, best_of, body.cache_salt,
                     priority=body.priority, stream_interval=body.stream_interval,
                     field="n" if best_of == body.n else "best_of")
    sub.grammar_param = constraint[0] if constraint else None
    fmt = formatter(state, sub.id, model, body)
    echo = texts if body.echo else []
    if not body.stream:
        choices = await collect(sub, request)
        if body.prompt_only:
            choices = [prompt_only_choice(c) for c in choices]

        def build() -> dict[str, Any]:
            generated = sum(len(c.token_ids) for c in choices)
            kept = best_choices(choices, best_of, body.n)
            answer = fmt.completion(kept, body.n, echo, body.logprobs, prompts,
                                    body.return_token_ids, body.prompt_logprobs)
            if best_of > body.n:  # every candidate was generated (OpenAI counts them all)
                u = answer["usage"]
                u["completion_tokens"] = generated
                u["total_tokens"] = u["prompt_tokens"] + generated
            return answer
        return await threaded_json(build)
    counts = {"completion": 0}
    cached: dict[int, int] = {}  # first choice of each prompt -> its cached tokens
    # echo alone goes out at once; with logprobs it rides on each choice's first chunk,
    # which carries the prompt logprobs
    first = [fmt.completion_chunk(i, echo[i // body.n], None, None)
             for i in range(len(sub.ids))] if echo and not echo_lps else []
    ids_sent: set[int] = set()  # choices whose prompt ids went out (return_token_ids)
    made = [0] * len(sub.ids)  # each choice's tokens so far (continuous_usage_stats)
    offset = [0] * len(sub.ids)  # each choice's next token's text_offset (logprobs)
    if body.continuous_usage:
        for c in first:
            c["usage"] = usage(len(prompts[c["choices"][0]["index"] // body.n]), 0)
    if body.return_token_ids:
        for c in first:
            c["choices"][0].update(prompt_token_ids=prompts[c["choices"][0]["index"] // body.n],
                                   token_ids=[])
            ids_sent.add(c["choices"][0]["index"])

    def chunk(i: int, out: RequestOutput) -> dict[str, Any] | None:
        if body.prompt_only:
            out = prompt_only_output(out)
        counts["completion"] += len(out.token_ids)
        made[i] += len(out.token_ids)
        if i % body.n == 0:
            cached[i] = out.num_cached_tokens
        lps = out.logprobs if body.logprobs is not None else None
        head = None
        if echo_lps and out.prompt_logprobs is not None:
            head = (echo[i // body.n], prompts[i // body.n], out.prompt_logprobs)
        got = fmt.completion_chunk(i, out.text, lps, out.finish_reason, out.stop_reason,
                                   head, offset[i], len(echo[i // body.n]) if echo else 0)
        if lps is not None:
            offset[i] = fmt.next_offset(offset[i] + (len(head[0]) if head else 0), lps)
        if body.return_token_ids:
            if i not in ids_sent:
                got["choices"][0]["prompt_token_ids"] = prompts[i // body.n]
                ids_sent.add(i)
            got["choices"][0]["token_ids"] = list(out.token_ids)
        if body.continuous_usage:
            got["usage"] = usage(len(prompts[i // body.n]), made[i], out.num_cached_tokens)
        return got

    def last() -> list[dict[str, Any]]:
        if not body.include_usage:
            return []
        prompt_tokens = sum(len(p) for p in prompts)
        return [fmt.usage_chunk("text_completion", prompt_tokens, counts["completion"],
                                sum(cached.values()))]

    return StreamingResponse(stream_events(sub, first, chunk, last),
                             media_type="text/event-stream", headers=SSE_HEADERS)


@router.post("/v1/chat/completions", response_model=None, responses={
    **ok("ChatCompletion", chunk="ChatCompletionChunk"),
    **errors(400, 401, 404, 408, 429, 503, rules=rejections.CHAT)})
async def chat_completions(body: ChatCompletionRequest, request: Request,
                           state: ReadyStateDep):
    check_prompt_logprobs(body)
    store = check_store(state, body)
    run = await start_chat(state, body)
    sub, readers = run.sub, run.readers
    fmt = formatter(state, sub.id, run.model, body)
    echo = chat_echo(body)
    if not body.stream:
        choices = await run.collect(request)

        def build() -> dict[str, Any]:
            answer = prepend_echo(fmt.chat(choices, body.logprobs, readers,
                                           run.details(choices),
                                           run.prompt if body.return_token_ids else None,
                                           body.prompt_logprobs), echo)
            if body.return_prompt_text:
                answer["prompt_text"] = prompt_text(state, run.prompt)
            return answer
        answer = await run_in_threadpool(build)
        if store:
            keep(state, request, body, answer)
        return await threaded_json(lambda: answer)
    whole = [Choice() for _ in sub.ids]  # what the stream adds up to (store: true)
    counts = {"completion": 0, "cached": 0}
    latest: dict[int, RequestOutput] = {}  # each choice's latest output (its usage counts)
    first = [fmt.chat_chunk(i, {"role": "assistant", "content": ""})
             for i in range(len(sub.ids))]
    # return_token_ids: the prompt's ids on each choice's first chunk, and each chunk the
    # ids it carries (ids of outputs held back ride on the next chunk sent)
    pending: dict[int, list[int]] = {}
    if body.return_token_ids:
        for c in first:
            c["prompt_token_ids"] = list(run.prompt)
            c["choices"][0]["token_ids"] = []
    if echo:  # the echoed text goes out at once, after each choice's role
        for i in range(len(sub.ids)):
            first.append(fmt.chat_chunk(i, {"content": echo}))
            if body.return_token_ids:
                first[-1]["choices"][0]["token_ids"] = []
    made = [0] * len(sub.ids)  # each choice's tokens so far (continuous_usage_stats)
    if body.continuous_usage:
        for c in first:
            c["usage"] = usage(len(run.prompt), 0)
    if body.return_prompt_text:  # on the first chunk only, as vLLM sends it
        first[0]["prompt_text"] = prompt_text(state, run.prompt)

    def chunk(i: int, out: RequestOutput) -> dict[str, Any] | None:
        counts["completion"] += len(out.token_ids)
        whole[i].add(out)
        latest[i] = out
        if i == 0:
            counts["cached"] = out.num_cached_tokens
        pending.setdefault(i, []).extend(out.token_ids)
        made[i] += len(out.token_ids)
        delta = readers[i].feed(out).to_openai()
        if not delta and not out.finished and not body.logprobs:
            return None  # held back (a tag or a call's name in progress): nothing to send
        lps = out.logprobs if body.logprobs else None
        got = fmt.chat_chunk(i, delta, lps, readers[i].chat_finish_reason(out.finish_reason))
        ids = pending.pop(i)
        if body.return_token_ids:
            got["choices"][0]["token_ids"] = ids
        if body.continuous_usage:
            got["usage"] = usage(len(run.prompt), made[i], out.num_cached_tokens)
        return got

    def last() -> list[dict[str, Any]]:
        if store:  # the readers hold each whole message now
            keep(state, request, body, prepend_echo(
                fmt.chat(whole, body.logprobs, readers, run.details(whole), None, None), echo))
        if not body.include_usage:
            return []
        return [fmt.usage_chunk("chat.completion.chunk", len(run.prompt), counts["completion"],
                                counts["cached"], run.details(list(latest.values())))]

    return StreamingResponse(stream_events(sub, first, chunk, last),
                             media_type="text/event-stream", headers=SSE_HEADERS)


_INVOCATION_BODY = {"requestBody": {"required": True, "content": {"application/json": {
    "schema": {"oneOf": [{"$ref": "#/components/schemas/ChatCompletionRequest"},
                         {"$ref": "#/components/schemas/CompletionRequest"}]}}}}}


@router.post("/invocations", response_model=None, openapi_extra=_INVOCATION_BODY,
             responses={**ok(("ChatCompletion", "Completion"),
                           chunk=("ChatCompletionChunk", "CompletionChunk")),
                        **errors(400, 401, 404, 408, 429, 503, rules=rejections.INVOCATIONS)})
async def invocations(request: Request, state: ReadyStateDep):
    """vLLM's (SageMaker's) one inference route: a body with ``messages`` is a chat
    completion, one with ``prompt`` a completion, answered as those routes answer."""
    try:
        data = await request.json()
    except json.JSONDecodeError as exc:  # said as the other routes say it: what, and where
        raise APIError(400, not_json_message(exc.msg, exc.pos)) from None
    except ValueError:  # bytes that are no UTF-8
        raise APIError(400, "the request body is not valid JSON: its bytes are no UTF-8"
                       ) from None
    except RecursionError:
        raise APIError(400, "the body nests deeper than the JSON parser reads") from None
    chat = isinstance(data, dict) and data.get("messages") is not None
    if not isinstance(data, dict) or chat == (data.get("prompt") is not None):
        raise APIError(400, "invocations: the body needs messages (a chat completion) or "
                       "prompt (a completion), not both")
    model = ChatCompletionRequest if chat else CompletionRequest
    try:
        body = model.model_validate(data)
    except ValidationError as exc:
        raise RequestValidationError(exc.errors()) from None
    if isinstance(body, ChatCompletionRequest):
        return await chat_completions(body, request, state)
    return await completions(body, request, state)
