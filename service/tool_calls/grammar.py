"""The constraint a chat request's plan asks for, compiled (CPU work: routes call this
through a thread pool; the compiler caches by spec). Tools with a tool parser get the
model's native call syntax (engine.structured.tool_call_grammar: required / named force
calls, auto constrains a call once the model starts one); otherwise a json_object /
json_schema response_format, or vLLM's structured_outputs, alone. A constraint that
cannot be compiled is a 400 naming the parameter (the offending tool's parameters when
one tool is at fault).

On a model with a reasoning parser every such constraint follows an optional reasoning
section (engine.structured.reasoning): the model may reason first, then the answer is
constrained, as vLLM constrains it once the reasoning has ended."""

from __future__ import annotations

from typing import Any

from engine.sampling_params import ThinkingBudget
from engine.structured import (
    GrammarError,
    json_schema_spec,
    spec_from_response_format,
    tool_call_grammar,
)
from engine.structured.reasoning import ReasoningMarkers, markers_for, reasoning_first
from service.errors import APIError
from service.tool_calls.plan import ChatPlan
from service.tool_calls.reasoning import REASONING_TAGS, STARTS_INSIDE


def _blame_tool(compiler: Any, plan: ChatPlan) -> str:
    """The first tool whose parameters schema does not compile on its own (as strictly
    as the call grammar compiles it), else "tools"."""
    for i, tool in enumerate(plan.tools or ()):
        params = tool["function"].get("parameters")
        if params is None:
            continue
        strict = tool["function"].get("strict") is True
        try:
            compiler.compile(json_schema_spec(params, tool["function"]["name"], strict=strict))
        except GrammarError:
            return f"tools[{i}].function.parameters"
    return "tools"


def _spec(tok: Any, plan: ChatPlan) -> Any:
    if plan.tool_parser is not None and plan.tools:
        return tool_call_grammar(plan.tools, plan.tool_choice, plan.parallel_tool_calls,
                                 style=plan.tool_parser, vocab=tok,
                                 response_format=plan.response_format,
                                 allowed=plan.allowed_tools)
    return spec_from_response_format(plan.response_format)


def section_markers(tok: Any, plan: ChatPlan, thinking: ThinkingBudget | None = None
                    ) -> ReasoningMarkers | None:
    """The reasoning section a constrained answer may open with: the plan's reasoning
    parser's markers in tokenizer ``tok``. None without a reasoning parser, and with a
    budget of 0 (``reasoning_effort: "none"``) unless the prompt opened the section: the
    answer is then constrained from its first token."""
    if plan.reasoning_parser is None:
        return None
    inside = plan.reasoning_parser in STARTS_INSIDE
    if thinking is not None and thinking.budget == 0 and not inside:
        return None
    begin, end = REASONING_TAGS[plan.reasoning_parser]
    # ThinkTagReasoningParser ends the section at "</think>" in the text too
    return markers_for(tok, begin, end, inside, begin != "[THINK]")


def _compile(compiler: Any, spec: Any, markers: ReasoningMarkers | None) -> Any:
    """``spec`` compiled after the reasoning section ``markers`` (None: alone). Where the
    whole is rejected, the constraint's own error is raised when it has one: its places
    (``at 1(8)``) are then in the client's grammar, not in the wrapper's lines."""
    if markers is None:
        return compiler.compile(spec)
    try:
        return compiler.compile(reasoning_first(spec, markers))
    except GrammarError:
        compiler.compile(spec)  # raises the constraint's own error, if it is at fault
        raise


def compile_plan_grammar(backend: Any, plan: ChatPlan, thinking: ThinkingBudget | None = None
                         ) -> Any:
    """``backend``: service.backend.ModelBackend -> engine.structured.CompiledGrammar or
    None (nothing constrained). ``thinking``: the request's cap on reasoning."""
    markers = section_markers(backend.tokenizer, plan, thinking)
    if plan.structured is not None:
        param, spec = plan.structured
        try:
            return _compile(backend.grammar_compiler, spec, markers)
        except GrammarError as exc:
            raise APIError(400, f"{param}: cannot be enforced as a grammar: {exc}",
                           param) from exc
    try:
        spec = _spec(backend.tokenizer, plan)
        if spec is None:
            return None
        return _compile(backend.grammar_compiler, spec, markers)
    except GrammarError as exc:
        with_tools = plan.tool_parser is not None and plan.tools
        param = "response_format"
        if with_tools:
            param = _blame_tool(backend.grammar_compiler, plan)
            if param == "tools" and plan.response_format is not None:
                param = "response_format"
        raise APIError(400, f"{param}: cannot be enforced as a grammar: {exc}",
                       param) from exc
