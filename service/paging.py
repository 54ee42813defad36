"""OpenAI's list pages (``limit``, ``order``, ``after``) over stored items: stored chat
completions, a response's input items, a conversation's items."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from service.errors import APIError


def page_items(items: list[dict[str, Any]], limit: int, order: str, after: str | None,
               where: str, keep: Callable[[dict[str, Any]], bool] | None = None
               ) -> dict[str, Any]:
    """OpenAI's item list page: ``order`` asc or desc, the items after the one whose id
    is ``after`` (else a 400 naming it: "is no ``where``"), at most ``limit``; ``keep``:
    a filter, applied after the cursor is found among all ``items`` (a cursor that no
    longer passes it, its metadata changed meanwhile, still places the next page)."""
    if order == "desc":
        items = items[::-1]
    if after is not None:
        at = next((i for i, item in enumerate(items) if item["id"] == after), None)
        if at is None:
            raise APIError(400, f"after: {after!r} is no {where}", "after")
        items = items[at + 1:]
    if keep is not None:
        items = [item for item in items if keep(item)]
    page = items[:limit]
    return {"object": "list", "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}
