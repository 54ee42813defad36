"""A request's cap on reasoning tokens, as the sampler enforces it
(engine.sampling_params.ThinkingBudget): the reasoning parser's markers resolved by name
from the tokenizer, so the budget counts exactly the tokens the parser reports as
reasoning. It can be enforced only where both markers are single tokens of the vocabulary
(``[THINK]`` / ``[/THINK]``, or ``<think>`` / ``</think>`` as added tokens); elsewhere, and
on a model without a reasoning parser, asking for one is a 400 naming the field.

Chat Completions takes vLLM's ``thinking_token_budget`` (an integer >= 0; -1 or null: no
cap) and ``reasoning_effort``: ``"none"`` is a budget of 0 on a reasoning model (a section
it opens is closed at once) and a no-op on one without a reasoning parser; the other
efforts are 400s, as there is no effort control to map them to.
"""

from __future__ import annotations

from typing import Any

from engine.sampling_params import ThinkingBudget
from service.errors import APIError
from service.tool_calls.plan import ChatPlan
from service.tool_calls.reasoning import REASONING_TAGS, STARTS_INSIDE


def thinking_budget(tok: Any, parser: str | None, budget: int, field: str) -> ThinkingBudget:
    """The budget for reasoning parser ``parser`` of tokenizer ``tok``; a 400 naming
    ``field`` where it cannot be enforced."""
    if parser is None:
        raise APIError(400, f"{field}: this model has no reasoning format the server can "
                       "read (start it with --reasoning-parser)", field)
    begin, end = REASONING_TAGS[parser]
    ids = [tok.token_to_id(begin), tok.token_to_id(end)]
    if None in ids:
        raise APIError(400, f"{field}: cannot be enforced on this model: its reasoning "
                       f"markers {begin} and {end} are not single tokens of its vocabulary",
                       field)
    return ThinkingBudget(ids[0], ids[1], budget, starts_inside=parser in STARTS_INSIDE)


def effort_budget(effort: str | None, field: str) -> int | None:
    """The budget a reasoning effort means: none -> 0; null -> no cap; else a 400."""
    if effort is None:
        return None
    if effort == "none":
        return 0
    raise APIError(400, f"{field}: {effort!r} is not supported: this server has no "
                   "reasoning-effort control (accepted: null, or \"none\": no reasoning, a "
                   "section the model opens is closed at once)", field)


def chat_thinking(tok: Any, plan: ChatPlan, body: Any) -> ThinkingBudget | None:
    """``body``: service.schemas.ChatCompletionRequest -> its cap, or None (no cap)."""
    effort = effort_budget(body.reasoning_effort, "reasoning_effort")
    if effort is not None and plan.reasoning_parser is None:
        effort = None  # no reasoning format: "none" is what the model does anyway
    given = body.thinking_token_budget if body.thinking_token_budget != -1 else None
    caps = [(n, f) for n, f in ((given, "thinking_token_budget"), (effort, "reasoning_effort"))
            if n is not None]
    if not caps:
        return None
    n, field = min(caps)
    return thinking_budget(tok, plan.reasoning_parser, n, field)
