"""The Responses API's ``truncation: "auto"``: when the conversation's prompt leaves no
room for the answer, its oldest turns are dropped until it does.

A turn starts at a user message; the context is cut just before one, so what is kept
always starts the way a conversation does (a user message, after any system or developer
messages), and a function call is never kept without the turn that made it, nor its
output without it. System and developer messages are instructions: they are always kept,
as ``instructions`` are. The cut is the earliest turn start whose kept context fits,
found by bisection (a prompt only shrinks as turns are dropped). When even the last turn
alone does not fit, that turn goes ahead, and the request gets the usual 400 for a prompt
too long.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from service.translate.schemas import MessageItem


def _instruction(item: Any) -> bool:
    return isinstance(item, MessageItem) and item.role in ("system", "developer")


def turn_starts(items: Sequence[Any]) -> list[int]:
    """The index of every user message in ``items``."""
    return [i for i, item in enumerate(items)
            if isinstance(item, MessageItem) and item.role == "user"]


def cut_at(items: Sequence[Any], start: int) -> list[Any]:
    """``items`` from ``start`` on, with every system or developer message before it."""
    return [item for i, item in enumerate(items) if i >= start or _instruction(item)]


async def fit(items: Sequence[Any], fits: Callable[[list[Any]], Awaitable[bool]]
              ) -> list[Any]:
    """The longest tail of ``items``, cut at a turn start, that ``fits`` (all of them when
    they fit; the last turn when none does)."""
    whole = list(items)
    starts = [s for s in turn_starts(whole) if s > 0]
    if not starts or await fits(whole):
        return whole
    lo, hi = 0, len(starts) - 1  # the answer is starts[hi] at the latest
    while lo < hi:
        mid = (lo + hi) // 2
        if await fits(cut_at(whole, starts[mid])):
            hi = mid
        else:
            lo = mid + 1
    return cut_at(whole, starts[lo])
