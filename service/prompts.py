"""Request prompts -> token ids (CPU work: routes call these through a thread pool).
Every failure is an APIError naming the parameter."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from service.backend import ServingState
from service.errors import APIError
from service.schemas import ChatMessage

IMAGE_PART_TYPES = ("image_url", "image", "input_image")


def _check_ids(state: ServingState, ids: Sequence[int], param: str) -> list[int]:
    vocab = state.backend.tokenizer.vocab_size
    bad = [t for t in ids if not isinstance(t, int) or t < 0 or t >= vocab]
    if bad:
        raise APIError(400, f"token ids {bad[:5]} out of range [0, {vocab})", param)
    if not ids:
        raise APIError(400, "prompt is empty", param)
    return list(ids)


def encode_prompts(state: ServingState, prompt: Any) -> tuple[list[list[int]], list[str]]:
    """/v1/completions ``prompt`` (str | list[str] | list[int] | list[list[int]]) ->
    (token ids per prompt, text per prompt for echo)."""
    tok = state.backend.tokenizer
    if isinstance(prompt, str):
        prompt = [prompt]
    if not prompt:
        raise APIError(400, "prompt must not be empty", "prompt")
    if all(isinstance(p, int) for p in prompt):
        prompt = [prompt]
    ids, texts = [], []
    for i, p in enumerate(prompt):
        param = f"prompt[{i}]" if len(prompt) > 1 else "prompt"
        if isinstance(p, str):
            ids.append(_check_ids(state, tok.encode(p, add_special_tokens=True), param))
            texts.append(p)
        else:
            ids.append(_check_ids(state, p, param))
            texts.append(tok.decode(p, skip_special_tokens=False))
    return ids, texts


def message_dicts(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """Chat messages as template dicts; text-part lists joined into one string; image
    parts refused."""
    out = []
    for i, m in enumerate(messages):
        if isinstance(m.content, list):
            for part in m.content:
                kind = part.get("type")
                if kind in IMAGE_PART_TYPES:
                    raise APIError(400, "images are not served by this server (text-only "
                                   "model serving)", f"messages[{i}].content")
                if kind != "text":
                    raise APIError(400, f"unsupported content part type {kind!r}",
                                   f"messages[{i}].content")
        d = m.model_dump(exclude_none=True)
        if isinstance(m.content, list):
            d["content"] = "".join(str(p.get("text", "")) for p in m.content)
        out.append(d)
    return out


def encode_chat(state: ServingState, messages: Sequence[ChatMessage],
                add_generation_prompt: bool = True) -> list[int]:
    dicts = message_dicts(messages)
    tok = state.backend.tokenizer
    try:
        ids = tok.encode_chat(dicts, add_generation_prompt=add_generation_prompt)
    except (ValueError, TypeError) as exc:  # ChatTemplateError is a ValueError
        raise APIError(400, f"messages: {exc}", "messages") from exc
    return _check_ids(state, ids, "messages")
