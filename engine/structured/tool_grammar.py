"""Tool-call grammars for OpenAI ``tools`` / ``tool_choice`` / ``parallel_tool_calls``.

Two wire styles:

* ``mistral`` (Ministral-3, tekken v13): ``[TOOL_CALLS]name[ARGS]{json}`` per call, where
  ``[TOOL_CALLS]`` and ``[ARGS]`` are the special tokens (resolved by name through
  ``vocab.token_to_id``, written ``<[id]>``), then EOS;
* ``hermes`` (ChatML / Qwen): ``<tool_call>\\n{"name": "...", "arguments": {json}}\\n
  </tool_call>`` blocks separated by ``\\n`` (plain text), then EOS.

``tool_choice``: ``"none"`` -> no tool grammar; ``"required"`` -> one or more calls
(exactly one when ``parallel_tool_calls`` is false); ``{"type": "function", "function":
{"name": n}}`` -> exactly one call of ``n``; ``"auto"`` -> free text, or text followed by
calls (once a call starts, the rest must be valid calls). ``allowed`` (OpenAI's
``allowed_tools``) narrows the calls of ``"auto"`` / ``"required"`` to those tools.
Arguments must be valid against each tool's ``parameters`` (strict when the tool says
``strict: true``, lenient otherwise).
A ``response_format`` with ``"auto"`` gives "JSON matching the format, or calls" (no free
text: it would defeat the format); with ``"none"`` the format alone.

mistral-common's GrammarFactory writes the same mistral grammar but applies argument
schemas only to strict tools and needs a MistralTokenizer, so the grammar is written here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from engine.structured.spec import (
    GrammarError,
    GrammarSpec,
    json_lark,
    spec_from_response_format,
)

STYLES = ("mistral", "hermes")
TEXT = r"/(.|\n)+/"
HERMES_TEXT = r"/(.|\n)+/ & ~/(?s:.*)<tool_call>(?s:.*)/"


class Vocab(Protocol):
    def token_to_id(self, token: str) -> int | None: ...


def _functions(tools: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, Mapping) else None
        if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str) \
                or not fn["name"]:
            raise GrammarError(f"tools[{i}]: expected {{'type': 'function', 'function': "
                               "{'name': ...}}")
        out.append(fn)
    return out


def _chosen(fns: list[Mapping[str, Any]], tool_choice: Any) -> tuple[str, list]:
    """-> (mode "auto" | "required" | "named", the functions that may be called)."""
    if tool_choice in ("auto", "required"):
        return tool_choice, fns
    name = (tool_choice.get("function") or {}).get("name") \
        if isinstance(tool_choice, Mapping) else None
    if name is None:
        raise GrammarError(f"tool_choice {tool_choice!r} is not supported")
    picked = [f for f in fns if f["name"] == name]
    if not picked:
        raise GrammarError(f"tool_choice names {name!r}, which is not among the tools "
                           f"{[f['name'] for f in fns]}")
    return "named", picked


# a function without parameters takes none (OpenAI's reading of an omitted schema)
NO_ARGUMENTS: dict[str, Any] = {"type": "object", "properties": {},
                                "additionalProperties": False}


def _args(fn: Mapping[str, Any]) -> str:
    """A call's arguments: always a JSON object (a schema without a root type, or with a
    root anyOf / $ref alone, allowed any JSON value), valid against the parameters."""
    params = fn.get("parameters")
    if params is None:
        params = NO_ARGUMENTS
    elif "type" not in params:
        params = {**params, "type": "object"}
    return json_lark(params, strict=fn.get("strict") is True)


def _special(vocab: Vocab | None, name: str) -> str:
    tid = None if vocab is None else vocab.token_to_id(name)
    if tid is None:
        raise GrammarError(f"style 'mistral' needs the special token {name} in the "
                           "tokenizer")
    return f"<[{tid}]>"


def _call_rules(fns: list, style: str, vocab: Vocab | None) -> list[str]:
    """One Lark rule ``fn_i: ...`` per function (one whole call)."""
    rules = []
    if style == "mistral":
        calls, args = _special(vocab, "[TOOL_CALLS]"), _special(vocab, "[ARGS]")
        for i, fn in enumerate(fns):
            rules.append(f"fn_{i}: {calls} {json.dumps(fn['name'])} {args} {_args(fn)}")
    else:
        for i, fn in enumerate(fns):
            head = json.dumps('{"name": ' + json.dumps(fn["name"]) + ', "arguments": ')
            rules.append(f"fn_{i}: {head} {_args(fn)} \"}}\"")
    return rules


def _body(style: str, mode: str, parallel: bool, fmt: GrammarSpec | None) -> list[str]:
    """The rules above the calls: start, calls, and (auto) the text before them."""
    many = parallel and mode != "named"
    tail = ' ("\\n" call)*' if many else ""
    if style == "mistral":
        lines = [f"calls: call{'+' if many else ''}"]
        text = [f"start: {TEXT} | {TEXT}? calls"]
    else:
        lines = ['call: "<tool_call>\\n" fn "\\n</tool_call>"', f"calls: call{tail}"]
        text = ["start: TEXT | text_calls", f"TEXT: {HERMES_TEXT}",
                "text_then_call[lazy]: /(.|\\n)*<tool_call>\\n/",
                f'text_calls: text_then_call fn "\\n</tool_call>"{tail}']
    if mode != "auto":
        return ["start: calls", *lines]
    if fmt is not None:
        return ["start: calls | answer", *lines,
                fmt.lark.replace("start:", "answer:", 1).strip()]
    return [*text, *lines]


def tool_call_grammar(tools: Sequence[Mapping[str, Any]], tool_choice: Any = "auto",
                      parallel_tool_calls: bool = True, style: str = "mistral",
                      vocab: Vocab | None = None,
                      response_format: Mapping[str, Any] | None = None,
                      allowed: Sequence[str] | None = None) -> GrammarSpec | None:
    """The grammar for a chat request with tools; None when nothing is constrained
    (``tool_choice`` "none" or no tools with "auto", and no response_format).
    ``allowed``: the names of the tools that may be called (OpenAI's allowed_tools, with
    ``tool_choice`` its mode); None: every tool."""
    if style not in STYLES:
        raise GrammarError(f"tool-call style {style!r} not in {STYLES}")
    fmt = spec_from_response_format(response_format)
    if tool_choice == "none" or (not tools and tool_choice == "auto"):
        return fmt
    if not tools:
        raise GrammarError(f"tool_choice {tool_choice!r} needs at least one tool")
    if fmt is not None and fmt.kind == "structural_tag":
        raise GrammarError("a structural_tag response_format goes alone: its tags and the "
                           "model's tool calls would be two grammars for the same text")
    mode, fns = _chosen(_functions(tools), tool_choice)
    if allowed is not None:
        fns = [f for f in fns if f["name"] in allowed]
        if not fns:
            raise GrammarError(f"allowed_tools names none of the tools {list(allowed)}")
    rules = _call_rules(fns, style, vocab)
    head = "call" if style == "mistral" else "fn"
    alts = " | ".join(f"fn_{i}" for i in range(len(fns)))
    lark = "\n".join([*_body(style, mode, parallel_tool_calls, fmt), f"{head}: {alts}",
                      *rules]) + "\n"
    names = ",".join(f["name"] for f in fns)
    return GrammarSpec(lark, f"tool calls ({style}, {mode}, {names})", f"tool_{style}")
