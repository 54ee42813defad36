"""The sandbox chat templates render in, with bounds a template cannot pass:

- ``*`` and ``**`` are checked before they run (not folded while the template compiles):
  a repetition of more than MAX_RENDER_CHARS items, or a power of more than MAX_POWER_BITS
  bits, is refused ('x' * 300000000 allocated 300 MB as it compiled);
- so is every other way to build a value without writing it out: ``+``, ``~``, ``%``,
  str methods and filters that join, pad, replace or format: a value whose text would pass
  MAX_RENDER_CHARS (its size: template_size.py) is refused before it is built (a few
  ``{% set s = s ~ s %}`` allocated gigabytes, as did ``"x".ljust(10**10)``);
- the rendered text is gathered chunk by chunk and refused past MAX_RENDER_CHARS (a loop
  over the messages wrote 1 GB in half a second);
- ``deadline_s`` (a request's own template, --trust-request-chat-template) bounds the
  render's time: a trace function checks the clock as the template's code runs (loops with
  no output ran for ever on a worker thread, past the request's end).

Every refusal is a ChatTemplateError (HTTP 400)."""

from __future__ import annotations

import sys
import time
from typing import Any

import jinja2
from jinja2.compiler import CodeGenerator, Frame
from jinja2.nodes import Concat
from jinja2.sandbox import ImmutableSandboxedEnvironment

from engine.text.template_size import (
    MAX_POWER_BITS,
    MAX_RENDER_CHARS,
    ChatTemplateBoundError,
    bound_call,
    bound_filters,
    bounded_concat,
    check_binop,
    check_output,
)

TRACE_EVERY = 4096  # trace events between clock reads


class _BoundedCodeGenerator(CodeGenerator):
    def visit_Concat(self, node: Concat, frame: Frame) -> None:
        """``a ~ b``: joined by the environment, which checks the size first."""
        self.write("environment.concat((")
        for arg in node.nodes:
            self.visit(arg, frame)
            self.write(", ")
        self.write("))")


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**", "+", "%"})
    code_generator_class = _BoundedCodeGenerator

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, finalize=check_output, **kwargs)
        bound_filters(self.filters)
        self.globals.pop("lipsum", None)  # n paragraphs of text for any n

    def concat(self, parts: tuple[Any, ...]) -> str:
        return bounded_concat(parts)

    def call(__self, __context: Any, __obj: Any, *args: Any,  # noqa: N805 - jinja's form
             **kwargs: Any) -> Any:
        bound_call(__obj, args, kwargs)
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        check_binop(operator, left, right)
        if operator == "**" and isinstance(left, int) and isinstance(right, int) and (
                right > 0 and abs(left) > 1
                and right * max(abs(left).bit_length(), 1) > MAX_POWER_BITS):
            raise ChatTemplateBoundError(f"a power of more than {MAX_POWER_BITS} bits")
        return super().call_binop(context, operator, left, right)


def render_bounded(template: jinja2.Template, variables: dict[str, Any],
                   deadline_s: float | None = None) -> str:
    """``template`` rendered with ``variables``, within MAX_RENDER_CHARS and, with
    ``deadline_s``, that many seconds (ChatTemplateBoundError past either)."""
    out: list[str] = []
    size = 0
    end = None if deadline_s is None else time.monotonic() + deadline_s
    previous = sys.gettrace()
    if end is not None:
        sys.settrace(_clock(end, deadline_s))
    try:
        for chunk in template.generate(**variables):
            size += len(chunk)
            if size > MAX_RENDER_CHARS:
                raise ChatTemplateBoundError(f"the template renders more than "
                                             f"{MAX_RENDER_CHARS} characters")
            out.append(chunk)
    finally:
        if end is not None:
            sys.settrace(previous)
    return "".join(out)


def _clock(end: float, deadline_s: float) -> Any:
    """A trace function that raises once the clock passes ``end`` (read every TRACE_EVERY
    events: the cost is a counter per line the template's code runs)."""
    count = 0

    def trace(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        count += 1
        if count % TRACE_EVERY == 0 and time.monotonic() > end:
            raise ChatTemplateBoundError(f"the template took longer than {deadline_s:g} s "
                                         "to render")
        return trace

    return trace
