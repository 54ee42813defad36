"""The constraint a chat request's plan asks for, compiled (CPU work: routes call this
through a thread pool; the compiler caches by spec). Tools with a tool parser get the
model's native call syntax (engine.structured.tool_call_grammar: required / named force
calls, auto constrains a call once the model starts one); otherwise a json_object /
json_schema response_format, or vLLM's structured_outputs, alone. A constraint that
cannot be compiled is a 400 naming the parameter (the offending tool's parameters when
one tool is at fault)."""

from __future__ import annotations

from typing import Any

from engine.structured import (
    GrammarError,
    json_schema_spec,
    spec_from_response_format,
    tool_call_grammar,
)
from service.errors import APIError
from service.structured_outputs import compile_spec
from service.tool_calls.plan import ChatPlan


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
                                 response_format=plan.response_format)
    return spec_from_response_format(plan.response_format)


def compile_plan_grammar(backend: Any, plan: ChatPlan) -> Any:
    """``backend``: service.backend.ModelBackend -> engine.structured.CompiledGrammar or
    None (nothing constrained)."""
    if plan.structured is not None:
        return compile_spec(backend, *plan.structured)
    try:
        spec = _spec(backend.tokenizer, plan)
        if spec is None:
            return None
        return backend.grammar_compiler.compile(spec)
    except GrammarError as exc:
        with_tools = plan.tool_parser is not None and plan.tools
        param = "response_format"
        if with_tools:
            param = _blame_tool(backend.grammar_compiler, plan)
            if param == "tools" and plan.response_format is not None:
                param = "response_format"
        raise APIError(400, f"{param}: cannot be enforced as a grammar: {exc}",
                       param) from exc
