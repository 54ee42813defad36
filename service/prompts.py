"""Request prompts -> token ids (CPU work: routes call these through a thread pool).
Every failure is an APIError naming the parameter."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from engine.text.chat_template import (
    IMAGE_PLACEHOLDER_URL,
    ChatTemplateError,
    check_template,
    template_reads,
)
from service.backend import ServingState
from service.errors import APIError
from service.schemas import ChatMessage
from service.tool_calls.call_ids import CallIdMap
from service.tool_calls.plan import ChatPlan

IMAGE_PART_TYPES = ("image_url", "image", "input_image")


def _check_ids(state: ServingState, ids: Sequence[int], param: str) -> list[int]:
    vocab = state.backend.tokenizer.vocab_size
    bad = [t for t in ids if not isinstance(t, int) or t < 0 or t >= vocab]
    if bad:
        raise APIError(400, f"{param}: token ids {bad[:5]} out of range [0, {vocab})", param)
    if not ids:
        raise APIError(400, f"{param}: prompt is empty", param)
    return list(ids)


# a text that is cut to its last tokens (truncate_prompt_tokens) or only counted
# (/tokenize) may run past what max_model_len holds, up to this many times: an encoding
# costs ~170 bytes of memory a character (8 MB of text took 1.4 GB), so none is unbounded
OVERSIZE_TEXT_FACTOR = 4


def check_text_fits(state: ServingState, chars: int, param: str, factor: int = 1) -> None:
    """A 400 for a text that cannot fit max_model_len however it encodes, before the
    tokenizer spends seconds (and the memory of an encoding) on it: N characters are at
    least N bytes, and a token stands for at most ``max_token_bytes`` of them (twice that
    here, room for a normalizer that shortens text). ``factor``: the text may be that
    many times longer (OVERSIZE_TEXT_FACTOR where it is cut or counted)."""
    limit = state.settings.max_model_len
    per_token = getattr(state.backend.tokenizer, "max_token_bytes", 1 << 30)
    most = 2 * limit * per_token * factor
    if chars > most:
        why = ("the prompt leaves no room to generate" if factor == 1 else
               f"{factor} times what max_model_len holds is the most that is encoded")
        raise APIError(400, f"{param}: {chars} characters cannot fit max_model_len {limit} "
                       f"(the longest token of this vocabulary holds {per_token} bytes): "
                       f"{why}", param)


def chat_text_chars(messages: Sequence[ChatMessage]) -> int:
    """The characters of the messages' text (string contents and text parts): a rendered
    chat prompt holds at least these."""
    n = 0
    for m in messages:
        if isinstance(m.content, str):
            n += len(m.content)
        elif m.content:
            n += sum(len(p["text"]) for p in m.content
                     if isinstance(p, dict) and isinstance(p.get("text"), str))
    return n


def _document_start(tok: Any) -> list[int]:
    """What a text that encodes to no tokens ("" included) prompts with: as in OpenAI's
    API, the start of a new document: the BOS token, else the end-of-text token that
    separates documents (the lowest EOS id); [] when the tokenizer has neither."""
    bos = getattr(tok, "bos_token_id", None)
    if bos is not None:
        return [bos]
    return sorted(getattr(tok, "eos_token_ids", ()) or ())[:1]


def truncate_prompt(state: ServingState, ids: list[int], keep: int | None) -> list[int]:
    """The last ``keep`` ids (vLLM's truncate_prompt_tokens; -1: max_model_len)."""
    if keep is None:
        return ids
    if keep == 0:
        raise APIError(400, "truncate_prompt_tokens: keep at least 1 token (or -1 for "
                       "max_model_len)", "truncate_prompt_tokens")
    limit = state.settings.max_model_len
    if keep > limit:
        raise APIError(400, f"truncate_prompt_tokens: {keep} is greater than max_model_len "
                       f"({limit}); keep at most that many, or -1", "truncate_prompt_tokens")
    keep = limit if keep == -1 else keep
    return ids[-keep:]


def encode_prompts(state: ServingState, prompt: Any, add_special_tokens: bool = True,
                   truncate: int | None = None) -> tuple[list[list[int]], list[str]]:
    """/v1/completions ``prompt`` (str | list[str] | list[int] | list[list[int]]) ->
    (token ids per prompt, text per prompt for echo). An empty text prompts with the start
    of a document (_document_start). ``truncate``: keep each prompt's last ids only (the
    echoed text is then the kept ids' text)."""
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
            check_text_fits(state, len(p), param,
                            1 if truncate is None else OVERSIZE_TEXT_FACTOR)
            encoded = tok.encode(p, add_special_tokens=add_special_tokens)
            encoded = encoded or _document_start(tok)
            kept = truncate_prompt(state, encoded, truncate)
            ids.append(_check_ids(state, kept, param))
            texts.append(p if len(kept) == len(encoded)
                         else tok.decode(kept, skip_special_tokens=False))
        else:
            kept = truncate_prompt(state, list(p), truncate)
            ids.append(_check_ids(state, kept, param))
            texts.append(tok.decode(kept, skip_special_tokens=False))
    return ids, texts


IMAGE_PLACEHOLDER = {"type": "image_url", "image_url": {"url": IMAGE_PLACEHOLDER_URL}}


def _parts(i: int, content: Any, images: bool = False) -> Any:
    """A content part list checked: text parts kept, image parts refused, or with
    ``images`` replaced by placeholders (the template renders each as one [IMG];
    service/images.py expands it). How the list reaches the template (joined or as
    parts) is engine/text/chat_template.normalize_messages's choice."""
    if not isinstance(content, list):
        return content
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        kind = part.get("type")
        if kind in IMAGE_PART_TYPES:
            if not images:
                raise APIError(400, "images are not served by this server (text-only "
                               "model serving)", f"messages[{i}].content")
            parts.append(IMAGE_PLACEHOLDER)
        elif kind != "text":
            raise APIError(400, f"unsupported content part type {kind!r}",
                           f"messages[{i}].content")
        elif not isinstance(text := part.get("text"), str):
            raise APIError(400, "a text content part needs `text`, a string; got "
                           f"{'none' if text is None else type(text).__name__}",
                           f"messages[{i}].content[{j}].text")
        else:
            parts.append({"type": "text", "text": text})
    return parts


def _check_tool_turns(messages: Sequence[ChatMessage]) -> None:
    """OpenAI's rules: tool_calls only on assistant turns; a tool turn answers a call an
    earlier assistant turn made."""
    seen: set[str] = set()
    for i, m in enumerate(messages):
        if m.tool_calls and m.role != "assistant":
            raise APIError(400, f"messages[{i}]: only assistant messages carry tool_calls",
                           f"messages[{i}].tool_calls")
        seen.update(c.id for c in m.tool_calls or ())
        if m.role != "tool":
            continue
        if not m.tool_call_id:
            raise APIError(400, f"messages[{i}]: a tool message needs tool_call_id",
                           f"messages[{i}].tool_call_id")
        if m.tool_call_id not in seen:
            raise APIError(400, f"messages[{i}].tool_call_id {m.tool_call_id!r} answers no "
                           "tool call of an earlier assistant message",
                           f"messages[{i}].tool_call_id")


def message_dicts(messages: Sequence[ChatMessage], map_id: Callable[[str], str] | None = None,
                  images: bool = False) -> list[dict[str, Any]]:
    """Chat messages as template dicts (OpenAI form: tool-call arguments stay JSON text;
    content None, a string or checked parts, shaped for the template by the tokenizer);
    image parts refused unless ``images``. ``map_id`` rewrites tool-call ids (Mistral
    tokenizers take 9-character ids only)."""
    _check_tool_turns(messages)
    keep = map_id or (lambda x: x)
    out = []
    for i, m in enumerate(messages):
        d = m.model_dump(exclude_none=True, exclude={"refusal", "reasoning"})
        d["content"] = _parts(i, m.refusal or m.content, images)
        if m.reasoning is not None:  # one name for the template (and mistral-common)
            d["reasoning_content"] = m.reasoning
        if m.tool_calls:
            d["tool_calls"] = [{**c.model_dump(), "id": keep(c.id)} for c in m.tool_calls]
        if m.tool_call_id is not None:
            d["tool_call_id"] = keep(m.tool_call_id)
        out.append(d)
    return out


def request_template(state: ServingState, source: str) -> str:
    """A request's chat_template (vLLM's), checked: the server takes them, it compiles."""
    if not state.settings.trust_request_chat_template:
        raise APIError(400, "chat_template: this server takes no request chat templates "
                       "(start it with --trust-request-chat-template)", "chat_template")
    try:
        check_template(source)
    except ChatTemplateError as exc:
        raise APIError(400, f"chat_template: {exc}", "chat_template") from None
    return source


def encode_chat(state: ServingState, messages: Sequence[ChatMessage],
                add_generation_prompt: bool = True, plan: ChatPlan | None = None,
                images: bool = False) -> list[int]:
    """Prompt ids; with a ``plan`` that offers tools, the template gets them (and Mistral
    tokenizers get 9-character call ids). ``images``: image parts render as one [IMG]
    each (service/images.py expands them), else they are refused."""
    mistral_ids = plan is not None and plan.tools and state.parsers.tool_parser == "mistral"
    dicts = message_dicts(messages, CallIdMap() if mistral_ids else None, images)
    tok = state.backend.tokenizer
    extra = {"tools": plan.tools} if plan is not None and plan.tools else {}
    if plan is not None and plan.template_kwargs:
        if getattr(tok, "chat_template", None) is None:
            raise APIError(400, "chat_template_kwargs: this model has no chat template to "
                           "pass them to (its chat encoding is mistral-common's)",
                           "chat_template_kwargs")
        extra.update(plan.template_kwargs)
    if plan is not None and plan.continue_final:
        extra["continue_final_message"] = True
    if plan is not None and plan.special_tokens:
        extra["add_special_tokens"] = True
    if plan is not None and plan.template is not None:
        extra["template"] = request_template(state, plan.template)
    if plan is not None and plan.documents is not None:
        source = extra.get("template") or getattr(tok, "chat_template", None)
        if source is None or "documents" not in template_reads(source):
            raise APIError(400, "documents: the chat template reads no documents (they "
                           "would be dropped); send them in a message, or use a template "
                           "that renders them (--chat-template)", "documents")
        extra["documents"] = plan.documents
    try:
        ids = tok.encode_chat(dicts, add_generation_prompt=add_generation_prompt, **extra)
    except (ValueError, TypeError) as exc:  # ChatTemplateError is a ValueError
        raise APIError(400, f"messages: {exc}", "messages") from exc
    return _check_ids(state, ids, "messages")
