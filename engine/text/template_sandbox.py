"""The sandbox chat templates render in, with bounds a template cannot pass:

- ``*`` and ``**`` are checked before they run (not folded while the template compiles):
  a repetition of more than MAX_RENDER_CHARS items, or a power of more than MAX_POWER_BITS
  bits, is refused ('x' * 300000000 allocated 300 MB as it compiled);
- the rendered text is gathered chunk by chunk and refused past MAX_RENDER_CHARS (a loop
  over the messages wrote 1 GB in half a second);
- ``deadline_s`` (a request's own template, --trust-request-chat-template) bounds the
  render's time: a trace function checks the clock as the template's code runs (loops with
  no output ran for ever on a worker thread, past the request's end).

Every refusal is a ChatTemplateError (HTTP 400)."""

from __future__ import annotations

import sys
import time
from collections.abc import Sized
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

MAX_RENDER_CHARS = 16 * 2**20  # far past any prompt max_model_len holds
MAX_POWER_BITS = 4096
TRACE_EVERY = 4096  # trace events between clock reads


class ChatTemplateBoundError(jinja2.TemplateError):
    """A template went past a bound (the caller reports it as a ChatTemplateError)."""


class BoundedEnvironment(ImmutableSandboxedEnvironment):
    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if (isinstance(seq, Sized) and not isinstance(seq, bool)
                        and isinstance(n, int) and len(seq) * max(n, 0) > MAX_RENDER_CHARS):
                    raise ChatTemplateBoundError(
                        f"a repetition of {len(seq) * n} items is past the "
                        f"{MAX_RENDER_CHARS} a template may build")
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
