"""The tool and output-format half of a chat request, checked once before anything runs:
which tools the prompt shows, which parsers read the output, what the grammar must force.
Every refusal is an APIError(400) naming the parameter."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from engine.structured import GrammarSpec
from service.errors import APIError
from service.structured_outputs import structured_spec
from service.tool_calls.select import ParserChoice


@dataclass(frozen=True)
class ChatPlan:
    tools: list[dict[str, Any]] | None  # OpenAI form, for the template; None: no tools
    tool_choice: str | dict[str, Any]  # "none" | "auto" | "required" | {"type", "function"}
    parallel_tool_calls: bool
    tool_parser: str | None  # None: the output is never read as tool calls
    reasoning_parser: str | None
    response_format: dict[str, Any] | None  # json_object / json_schema; None: free text
    # vLLM's structured_outputs (or a guided_* field): (the field, its constraint)
    structured: tuple[str, GrammarSpec] | None = None
    # vLLM's chat_template_kwargs: more variables for the chat template
    template_kwargs: dict[str, Any] = field(default_factory=dict)
    # vLLM's continue_final_message: the prompt ends inside the final assistant message
    continue_final: bool = False
    # vLLM's add_special_tokens on chat: the tokenizer's special tokens (BOS) on top of
    # what the template writes
    special_tokens: bool = False
    # vLLM's chat_template: the request's own template (service/prompts.py checks it)
    template: str | None = None
    # vLLM's documents: the template's documents variable (service/prompts.py checks it)
    documents: list[dict[str, str]] | None = None
    # OpenAI's allowed_tools: the names the model may call (tool_choice is then its mode,
    # "auto" or "required"); None: any of the tools
    allowed_tools: tuple[str, ...] | None = None

    @property
    def forced_function(self) -> str | None:
        tc = self.tool_choice
        return tc["function"]["name"] if isinstance(tc, dict) else None

    @property
    def forces_calls(self) -> bool:
        return self.tool_choice == "required" or self.forced_function is not None


def _tool_choice(body: Any) -> tuple[str | dict[str, Any], tuple[str, ...] | None]:
    """(the choice, the names allowed_tools lets the model call; None: any). An
    allowed_tools choice is its mode, with its names."""
    tc = body.tool_choice
    if tc is None:
        return ("auto" if body.tools else "none"), None
    if isinstance(tc, str):
        return tc, None
    if tc.type == "allowed_tools":
        allowed = tc.allowed_tools
        return allowed.mode, tuple(dict.fromkeys(t.function.name for t in allowed.tools))
    return tc.model_dump(), None


def _check_allowed(body: Any, allowed: tuple[str, ...] | None) -> None:
    names = [t.function.name for t in body.tools or ()]
    for i, t in enumerate(body.tool_choice.allowed_tools.tools if allowed else ()):
        if t.function.name not in names:
            param = f"tool_choice.allowed_tools.tools.{i}.function.name"
            raise APIError(400, f"{param}: allowed_tools names function "
                           f"{t.function.name!r}, which is not among the tools "
                           f"({', '.join(names) or 'none were given'})", param)


def _check_tools(body: Any, choice: str | dict[str, Any], parsers: ParserChoice) -> None:
    names = [t.function.name for t in body.tools or ()]
    if len(set(names)) != len(names):
        dup = next(n for n in names if names.count(n) > 1)
        raise APIError(400, f"tools: function name {dup!r} is given twice", "tools")
    if choice != "none" and not names:
        raise APIError(400, "tool_choice needs tools: no tools were given", "tool_choice")
    if isinstance(choice, dict) and choice["function"]["name"] not in names:
        raise APIError(400, f"tool_choice names function {choice['function']['name']!r}, "
                       f"which is not among the tools ({', '.join(names)})", "tool_choice")
    if choice != "none" and parsers.tool_parser is None:
        raise APIError(400, "tools: this model has no tool-call format the server can read "
                       "(start it with --tool-call-parser mistral|hermes)", "tools")


def _response_format(body: Any, choice: str | dict[str, Any]) -> dict[str, Any] | None:
    rf = body.response_format
    if rf is None or rf.type == "text":
        return None
    if choice == "required" or isinstance(choice, dict):
        raise APIError(400, "response_format json_object/json_schema cannot be combined with "
                       "tool_choice required or a named function (the output must be a "
                       "tool call)", "response_format")
    return rf.model_dump(by_alias=True, exclude_none=True)


def _structured(body: Any, choice: str | dict[str, Any],
                fmt: dict[str, Any] | None) -> tuple[str, GrammarSpec] | None:
    """structured_outputs constrains the whole output, so it goes with no other format
    and no tool the model may call."""
    got = structured_spec(body)
    if got is None:
        return None
    param = got[0]
    if fmt is not None:
        raise APIError(400, f"{param}: cannot be combined with response_format (both "
                       "constrain the whole output; send one)", param)
    if choice != "none":
        raise APIError(400, f"{param}: cannot be combined with tools the model may call "
                       "(the output must follow the constraint; send tool_choice none, "
                       "or no tools)", param)
    return got


# what the server itself gives the template: a chat_template_kwargs entry may not replace it
RESERVED_TEMPLATE_VARIABLES = frozenset({
    "messages", "tools", "add_generation_prompt", "documents", "bos_token", "eos_token",
    "unk_token", "pad_token", "raise_exception", "strftime_now"})


def _template_kwargs(body: Any) -> dict[str, Any]:
    kwargs = getattr(body, "chat_template_kwargs", None) or {}
    taken = sorted(RESERVED_TEMPLATE_VARIABLES & set(kwargs))
    if taken:
        raise APIError(400, f"chat_template_kwargs.{taken[0]}: the server sets this "
                       "template variable itself (from the request's own fields)",
                       f"chat_template_kwargs.{taken[0]}")
    return dict(kwargs)


def _continue_final(body: Any) -> bool:
    """continue_final_message, checked: the final message is an assistant's text, and no
    generation prompt is asked for too (vLLM's rule)."""
    if not getattr(body, "continue_final_message", False):
        return False
    param = "continue_final_message"
    if body.add_generation_prompt:
        raise APIError(400, f"{param}: cannot be combined with add_generation_prompt true "
                       "(send add_generation_prompt: false to continue the final message)",
                       param)
    last = body.messages[-1]
    if last.role != "assistant" or last.tool_calls:
        raise APIError(400, f"{param}: the final message must be an assistant message "
                       "with text and no tool calls", param)
    return True


def plan_chat(body: Any, parsers: ParserChoice) -> ChatPlan:
    """``body``: service.schemas.ChatCompletionRequest."""
    choice, allowed = _tool_choice(body)
    _check_tools(body, choice, parsers)
    _check_allowed(body, allowed)
    tools = [t.model_dump(exclude_none=True) for t in body.tools] if body.tools else None
    fmt = _response_format(body, choice)
    return ChatPlan(tools=tools, tool_choice=choice,
                    parallel_tool_calls=body.parallel_tool_calls,
                    tool_parser=parsers.tool_parser if choice != "none" else None,
                    reasoning_parser=parsers.reasoning_parser,
                    response_format=fmt, structured=_structured(body, choice, fmt),
                    template_kwargs=_template_kwargs(body),
                    continue_final=_continue_final(body),
                    special_tokens=getattr(body, "add_special_tokens", False),
                    template=getattr(body, "chat_template", None),
                    documents=getattr(body, "documents", None), allowed_tools=allowed)
