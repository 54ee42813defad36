"""The Conversations API's conversations: ordered items that ``POST /v1/responses`` with
``conversation`` reads as its context and appends its input and output to, and that
``/v1/conversations/...`` create, read, extend and prune.

In this process's memory, as the response store (service/store/responses.py): a restart
forgets them, replicas do not share them, each API key reads only its own, and whole
conversations are evicted least recently used past a byte budget
(``--conversations-store-mib``; 0: the routes and the ``conversation`` field are 400s),
the oldest of the key that holds the most bytes first (service/store/fair.py).

A conversation holds its items twice: validated (service.translate.schemas.InputItem,
what a prompt is built from) and as JSON with an ``id`` (what the routes list). The
budget counts the JSON.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from service.store.fair import victim
from service.store.responses import json_bytes

log = logging.getLogger(__name__)


@dataclass
class Conversation:
    id: str
    created_at: int
    metadata: dict[str, str]
    items: list[Any] = field(default_factory=list)  # validated InputItems
    listed: list[dict[str, Any]] = field(default_factory=list)  # the same, as JSON
    nbytes: int = 0

    def body(self) -> dict[str, Any]:
        return {"id": self.id, "object": "conversation", "created_at": self.created_at,
                "metadata": self.metadata}

    def find(self, item_id: str) -> int | None:
        return next((i for i, d in enumerate(self.listed) if d["id"] == item_id), None)


def _size(conv: Conversation) -> int:
    return conv.nbytes


class ConversationTooLarge(ValueError):
    """Items that would make one conversation bigger than the whole store's budget."""


class ConversationStore:
    """Least recently used conversations within ``budget_bytes``; every call is made on
    the event loop (no lock)."""

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes <= 0:
            raise ValueError("a conversation store needs a positive byte budget")
        self.budget = budget_bytes
        self.used = 0
        self._convs: OrderedDict[tuple[str, str], Conversation] = OrderedDict()

    def __len__(self) -> int:
        return len(self._convs)

    def create(self, tenant: str, metadata: dict[str, str]) -> Conversation:
        conv = Conversation(f"conv_{uuid.uuid4().hex}", int(time.time()), dict(metadata))
        conv.nbytes = json_bytes(conv.body())
        self._convs[(tenant, conv.id)] = conv
        self.used += conv.nbytes
        self._evict(conv)
        return conv

    def get(self, tenant: str, conv_id: str) -> Conversation | None:
        """The conversation, now the most recently used; None when absent or another
        key's."""
        conv = self._convs.get((tenant, conv_id))
        if conv is not None:
            self._convs.move_to_end((tenant, conv_id))
        return conv

    def append(self, tenant: str, conv: Conversation, items: Sequence[Any],
               listed: Sequence[dict[str, Any]]) -> bool:
        """Add items (validated, and as JSON with ids) at the end; False when the
        conversation is no longer kept (deleted or evicted meanwhile). Raises
        ConversationTooLarge, changing nothing, when the conversation would outgrow the
        whole budget: no other conversation is evicted for one that cannot be kept."""
        if self._convs.get((tenant, conv.id)) is not conv:
            return False
        grown = sum(json_bytes(d) for d in listed)
        if conv.nbytes + grown > self.budget:
            raise ConversationTooLarge(
                f"the conversation would hold {conv.nbytes + grown} bytes, over the store's "
                f"budget of {self.budget} (--conversations-store-mib)")
        conv.items += items
        conv.listed += listed
        conv.nbytes += grown
        self.used += grown
        self._convs.move_to_end((tenant, conv.id))
        self._evict(conv)
        return True

    def remove_item(self, conv: Conversation, at: int) -> None:
        gone = json_bytes(conv.listed.pop(at))
        del conv.items[at]
        conv.nbytes -= gone
        self.used -= gone

    def set_metadata(self, conv: Conversation, metadata: dict[str, str]) -> None:
        before = json_bytes(conv.body())
        conv.metadata = dict(metadata)
        change = json_bytes(conv.body()) - before
        conv.nbytes += change
        self.used += change
        self._evict(conv)

    def delete(self, tenant: str, conv_id: str) -> bool:
        conv = self._convs.pop((tenant, conv_id), None)
        if conv is None:
            return False
        self.used -= conv.nbytes
        return True

    def _evict(self, keep: Conversation) -> None:
        """Least recently used first, of the key holding the most bytes
        (service/store/fair.py), until the budget holds; never ``keep`` (just grown, and
        within the budget on its own: append refuses more)."""
        while self.used > self.budget and (key := victim(self._convs, _size, keep)):
            old = self._convs.pop(key)
            self.used -= old.nbytes
            log.warning("conversation %s evicted: the store is over its budget of %d bytes "
                        "(--conversations-store-mib)", old.id, self.budget)
