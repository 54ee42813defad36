"""Which tool-call and reasoning parsers a model gets, decided once at startup from its
tokenizer and chat template (``--tool-call-parser``, ``--reasoning-parser``).

auto picks ``mistral`` when the tokenizer has ``[TOOL_CALLS]`` (and ``[ARGS]`` or the older
JSON-list form), ``hermes`` when the chat template writes ``<tool_call>`` blocks, else
none; reasoning: ``mistral`` when the tokenizer has ``[THINK]`` and ``[/THINK]``, ``think``
when the template mentions ``<think>`` (``think-open`` when its generation prompt, rendered
for a one-message conversation, leaves a section open), else none. A parser named
explicitly must fit the tokenizer, or startup fails naming why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from service.tool_calls.output import REASONING_PARSERS, TOOL_PARSERS
from service.tool_calls.reasoning import opens_section

TOOL_CHOICES = ("auto", "none", *TOOL_PARSERS)
REASONING_CHOICES = ("auto", "none", *(p for p in REASONING_PARSERS if p != "mistral-open"))


class ParserChoiceError(ValueError):
    """The parser named on the command line cannot work with this tokenizer."""


@dataclass(frozen=True)
class ParserChoice:
    tool_parser: str | None
    reasoning_parser: str | None
    why: str  # one line for the startup log

    def as_dict(self) -> dict[str, Any]:
        return {"tool_call_parser": self.tool_parser or "none",
                "reasoning_parser": self.reasoning_parser or "none"}


def _has(tok: Any, *names: str) -> bool:
    lookup = getattr(tok, "token_to_id", None)  # test tokenizers may have none
    return lookup is not None and all(lookup(n) is not None for n in names)


def _template(tok: Any) -> str:
    return getattr(tok, "chat_template", None) or ""


def _auto_tool(tok: Any) -> str | None:
    if _has(tok, "[TOOL_CALLS]"):
        return "mistral"
    if "<tool_call>" in _template(tok):
        return "hermes"
    return None


PROBE = [{"role": "user", "content": "Hi"}]  # a conversation any template renders


def _generation_prompt(tok: Any) -> str | None:
    """What the chat template adds for the answer (the prompt rendered with its
    generation prompt, past the one rendered without), or None where it cannot be told
    (no render, or the two do not share their start)."""
    render = getattr(tok, "apply_chat_template", None)
    if render is None:
        return None
    try:
        without, with_prompt = render(PROBE, False), render(PROBE, True)
    except Exception:  # noqa: BLE001 - a template that needs more than PROBE
        return None
    if not isinstance(with_prompt, str) or not with_prompt.startswith(without):
        return None
    return with_prompt[len(without):]


def _auto_reasoning(tok: Any) -> str | None:
    if _has(tok, "[THINK]", "[/THINK]"):
        return "mistral"
    template = _template(tok)
    if "<think>" not in template:
        return None
    prompt = _generation_prompt(tok)
    if prompt is not None:  # the generation prompt leaves a section open, or not
        return "think-open" if opens_section("<think>", "</think>", prompt) else "think"
    opens = "<|im_start|>assistant\n<think>" in template or "'<think>\\n'" in template
    return "think-open" if opens else "think"


def _check_fits(tok: Any, tool: str | None, reasoning: str | None) -> None:
    if tool == "mistral" and not _has(tok, "[TOOL_CALLS]"):
        raise ParserChoiceError("--tool-call-parser mistral: the tokenizer has no "
                                "[TOOL_CALLS] token")
    if reasoning == "mistral" and not _has(tok, "[THINK]", "[/THINK]"):
        raise ParserChoiceError("--reasoning-parser mistral: the tokenizer has no "
                                "[THINK]/[/THINK] tokens")


def choose_parsers(tok: Any, tool_flag: str = "auto", reasoning_flag: str = "auto"
                   ) -> ParserChoice:
    """The parsers for tokenizer ``tok`` (engine.text.tokenizer.Tokenizer or any object with
    ``token_to_id`` and ``chat_template``) under the two command-line choices."""
    for flag, choices, name in ((tool_flag, TOOL_CHOICES, "--tool-call-parser"),
                                (reasoning_flag, REASONING_CHOICES, "--reasoning-parser")):
        if flag not in choices:
            raise ParserChoiceError(f"{name} {flag!r}: choose from {', '.join(choices)}")
    tool = _auto_tool(tok) if tool_flag == "auto" else (None if tool_flag == "none"
                                                        else tool_flag)
    reasoning = (_auto_reasoning(tok) if reasoning_flag == "auto"
                 else None if reasoning_flag == "none" else reasoning_flag)
    _check_fits(tok, tool, reasoning)
    why = (f"tool calls: {tool or 'none'} ({tool_flag}), "
           f"reasoning: {reasoning or 'none'} ({reasoning_flag})")
    return ParserChoice(tool, reasoning, why)
