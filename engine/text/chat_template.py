"""Chat templates: found in a checkpoint directory and rendered in a sandboxed jinja2
environment with the variables and filters Hugging Face provides (``messages``,
``add_generation_prompt``, ``bos_token``, ``eos_token``, ``tools``, ``raise_exception``,
``strftime_now``, the ``tojson`` filter, loop controls, trim_blocks/lstrip_blocks)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from datetime import date, datetime, timedelta
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from jinja2 import meta
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.text.content_format import CONTENT_FORMATS, detect_content_format
from engine.text.template_sandbox import BoundedEnvironment, render_bounded
from engine.text.template_size import bounded_filter

ROLES = ("system", "user", "assistant", "tool", "developer")


class ChatTemplateError(ValueError):
    """Bad chat messages or a template that fails to render (HTTP 400)."""


def load_chat_template(model_dir: Path) -> str | None:
    """``chat_template.jinja``, else ``tokenizer_config.json``'s ``chat_template`` (a string
    or a list of ``{"name", "template"}``, where "default" wins), else None.
    A template that is not text, or an empty chat_template.jinja, raises ChatTemplateError
    naming its file: every chat request would have failed, or rendered nothing."""
    jinja_file = model_dir / "chat_template.jinja"
    if jinja_file.is_file():
        return _nonempty(read_template_file(jinja_file), jinja_file)
    cfg_file = model_dir / "tokenizer_config.json"
    if not cfg_file.is_file():
        return None
    cfg = json.loads(cfg_file.read_text(encoding="utf-8"))
    tpl = cfg.get("chat_template") if isinstance(cfg, dict) else None
    if isinstance(tpl, list):
        named = {t.get("name"): t.get("template") for t in tpl if isinstance(t, dict)}
        tpl = named.get("default") or next(iter(named.values()), None)
    if tpl is not None and not isinstance(tpl, str):
        raise ChatTemplateError(f"{cfg_file}: chat_template must be a string or a list of "
                                f"{{\"name\", \"template\"}} objects, got {tpl!r:.60}")
    return tpl or None  # "": no template, as where the key is absent


def read_template_file(path: Path) -> str:
    """A template file's text; ChatTemplateError naming it when it is not UTF-8."""
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise ChatTemplateError(f"{path}: not UTF-8 text ({exc})") from None


def _nonempty(source: str, where: Path) -> str:
    if not source.strip():
        raise ChatTemplateError(f"{where}: the chat template is empty")
    return source


@lru_cache(maxsize=8)
def template_reads(source: str) -> frozenset[str]:
    """The variables ``source`` reads that it does not set itself (jinja2.meta)."""
    env = ImmutableSandboxedEnvironment(extensions=[loopcontrols])
    try:
        return frozenset(meta.find_undeclared_variables(env.parse(source)))
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template syntax error line {exc.lineno}: {exc}") from exc


def check_template(source: str) -> None:
    """ChatTemplateError when ``source`` does not compile."""
    _compile(source)


def template_from_flag(value: str) -> str:
    """vLLM's --chat-template: a file's path (read) or the template itself (text with
    Jinja markup); compiled here so that a bad one stops the server at startup."""
    path = Path(value).expanduser()
    if path.is_file():
        source, where = read_template_file(path), f"--chat-template {path}"
    elif "{{" in value or "{%" in value:
        source, where = value, "--chat-template"
    else:
        raise ChatTemplateError(f"--chat-template {value!r}: no such file, and not a "
                                "template ({{ }} or {% %} markup)")
    try:
        _compile(source)
    except ChatTemplateError as exc:  # named the error, not the flag or the file
        raise ChatTemplateError(f"{where}: {exc}") from None
    return source


def _raise_exception(message: str) -> None:
    raise ChatTemplateError(f"chat template: {message}")


def _tojson(x: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    env = BoundedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = bounded_filter("tojson", _tojson)
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template syntax error line {exc.lineno}: {exc}") from exc


IMAGE_PLACEHOLDER_URL = "fp8serve:image"  # service/prompts.py: one image part, one [IMG]


def _is_image(part: Any) -> bool:
    """The server's image placeholder (an image the server has already encoded); any
    other image part is refused here."""
    if not isinstance(part, Mapping) or part.get("type") != "image_url":
        return False
    url = part.get("image_url")
    return isinstance(url, Mapping) and url.get("url") == IMAGE_PLACEHOLDER_URL


def _check_content(i: int, content: Any) -> None:
    if content is None or isinstance(content, str):
        return
    if isinstance(content, Sequence):
        for part in content:
            if _is_image(part):  # the server's image placeholder (one [IMG])
                continue
            if not isinstance(part, Mapping) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                raise ChatTemplateError(
                    f"messages[{i}].content: only text parts are supported, got {kind!r}")
        return
    raise ChatTemplateError(f"messages[{i}].content must be a string or a list of parts")


# Text parts joined into one string where the template takes a string (a "string"
# template's contents, any template's tool results): vLLM's separator. The mistral-common
# encoding gets the parts themselves and joins them its own way ("\n\n" for v13).
PART_JOIN = "\n"
# normalize_messages' own format for the mistral-common encoding: every part list kept.
PARTS = "parts"


def _content(role: str, content: Any, content_format: str) -> Any:
    """One message's content as the template takes it: None is "" ("string", "parts") or
    [] ("openai"); a string stays a string; a part list is joined with PART_JOIN for a
    "string" template and for tool results under a template (templates print those), else
    kept as ``{"type": "text", "text": ...}`` parts; image placeholders keep their list."""
    if content is None:
        return [] if content_format == "openai" else ""
    if isinstance(content, str):
        return content
    images = any(_is_image(p) for p in content)
    if not images and content_format != PARTS and (content_format == "string"
                                                   or role == "tool"):
        return PART_JOIN.join(str(p.get("text", "")) for p in content)
    return [dict(p) if _is_image(p) else {"type": "text", "text": str(p.get("text", ""))}
            for p in content]


def normalize_messages(messages: Any, content_format: str = "string") -> list[dict[str, Any]]:
    """Validate chat messages and shape each content for a template of ``content_format``
    (detect_content_format): the one place where None, strings and part lists are
    normalized, for the Jinja and the mistral-common paths alike."""
    if content_format not in (*CONTENT_FORMATS, PARTS):
        raise ValueError(f"content_format {content_format!r} not in {CONTENT_FORMATS}")
    if not isinstance(messages, Sequence) or isinstance(messages, str) or not messages:
        raise ChatTemplateError("messages must be a non-empty list")
    out = []
    for i, m in enumerate(messages):
        if not isinstance(m, Mapping):
            raise ChatTemplateError(f"messages[{i}] must be an object")
        role = m.get("role")
        if role not in ROLES:
            raise ChatTemplateError(f"messages[{i}].role {role!r} not one of {', '.join(ROLES)}")
        _check_content(i, m.get("content"))
        out.append({**m, "content": _content(role, m.get("content"), content_format)})
    return out


def fill_dates(source: str, today: date | None = None) -> str:
    """The published Ministral-3 templates write a default system prompt with literal
    ``{today}`` and ``{yesterday}`` placeholders: fill them (ISO dates) in the template
    source, so a user message that contains the braces is never touched."""
    if "{today}" not in source and "{yesterday}" not in source:
        return source
    today = today or date.today()
    return (source.replace("{today}", today.isoformat())
            .replace("{yesterday}", (today - timedelta(days=1)).isoformat()))


def _arguments_as_objects(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant tool calls with their JSON ``arguments`` text parsed into objects, as
    transformers' templates expect them (and as vLLM passes them)."""
    for i, m in enumerate(messages):
        calls = m.get("tool_calls")
        if not calls:
            continue
        fixed = []
        for j, call in enumerate(calls):
            fn = dict(call.get("function") or {})
            if isinstance(fn.get("arguments"), str):
                try:
                    fn["arguments"] = json.loads(fn["arguments"] or "{}")
                except json.JSONDecodeError as exc:
                    raise ChatTemplateError(f"messages[{i}].tool_calls[{j}].function."
                                            f"arguments is not valid JSON: {exc}") from exc
            fixed.append({**call, "function": fn})
        messages[i] = {**m, "tool_calls": fixed}
    return messages


def _developer_as_system(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """OpenAI's ``developer`` messages as ``system`` ones, for a template that knows no
    developer role (OpenAI's own reading: developer messages replace system messages; the
    mistral-common encoding does the same)."""
    return [{**m, "role": "system"} if m["role"] == "developer" else m for m in messages]


def content_text(content: Any, content_format: str = "string") -> str:
    """A message content's text as a template of ``content_format`` prints it: a string as
    it is, None as "", a part list's text parts joined with PART_JOIN ("string") or
    one after another ("openai": the templates that loop over parts print them so)."""
    if isinstance(content, str):
        return content
    sep = PART_JOIN if content_format == "string" else ""
    return sep.join(p.get("text", "") for p in content or () if isinstance(p, Mapping)
                    and p.get("type") == "text")


def cut_after_final_message(rendered: str, messages: Sequence[Mapping[str, Any]],
                            content_format: str = "string") -> str:
    """``rendered`` (a prompt rendered without a generation prompt) cut right after the
    final message's text, so that the model continues that message rather than starting
    another (vLLM's ``continue_final_message``, as transformers does it: the last place the
    text, or the text without surrounding whitespace when the template strips it, occurs;
    for a part list, else the last place of its final text part)."""
    if not messages or messages[-1].get("role") != "assistant":
        raise ChatTemplateError("continue_final_message: the final message must be the "
                                "assistant's")
    content = messages[-1].get("content")
    text = content_text(content, content_format)
    if not text.strip():
        raise ChatTemplateError("continue_final_message: the final assistant message has no "
                                "text to continue")
    needles = [text, text.strip()]
    if not isinstance(content, str):
        last = [p["text"] for p in content if isinstance(p, Mapping)
                and p.get("type") == "text" and str(p.get("text", "")).strip()]
        needles += [last[-1], last[-1].strip()]
    for needle in needles:
        at = rendered.rfind(needle)
        if at >= 0:
            return rendered[:at + len(needle)]
    raise ChatTemplateError("continue_final_message: the chat template does not render the "
                            "final message's text as it was sent")


def render_chat_template(
    source: str,
    messages: Sequence[Mapping[str, Any]],
    add_generation_prompt: bool = True,
    special_tokens: Mapping[str, str | None] | None = None,
    content_format: str | None = None,
    deadline_s: float | None = None,
    **kwargs: Any,
) -> str:
    """Render ``source`` for ``messages``. special_tokens: bos_token, eos_token, ... as text;
    content_format: "string" | "openai" (None: detect_content_format(source));
    deadline_s: the most the render may take (a request's own template; the sandbox's
    other bounds always hold: engine/text/template_sandbox.py).
    Raises ChatTemplateError for bad messages or template failures."""
    template = _compile(fill_dates(source))
    variables = {**(special_tokens or {}), **kwargs}
    fmt = content_format or detect_content_format(source)
    messages = _arguments_as_objects(normalize_messages(messages, fmt))
    if "developer" not in source:
        messages = _developer_as_system(messages)
    try:
        return render_bounded(template, {"messages": messages,
                                         "add_generation_prompt": add_generation_prompt,
                                         **variables}, deadline_s)
    except ChatTemplateError:
        raise
    except (jinja2.TemplateError, TypeError, KeyError, ValueError, AttributeError) as exc:
        raise ChatTemplateError(f"chat template failed to render: {exc}") from exc
