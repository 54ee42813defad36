"""The Responses API's stored responses: what ``store`` keeps, ``previous_response_id``
continues, and ``GET`` / ``DELETE /v1/responses/{id}`` (and ``.../input_items``) read.

In this process's memory, as vLLM keeps them: a restart forgets them, and replicas do not
share them (route a conversation to one replica). Entries are kept per API key (a key
reads only what it stored) and evicted least recently used past a byte budget
(``--responses-store-mib``; 0: nothing is stored), the oldest of the key that holds the
most bytes first (service/store/fair.py): one key filling the store evicts its own.

Each entry holds:
- ``response``: the response object as it was answered (the non-streaming body, or the
  stream's ``response.completed`` snapshot), a JSON-ready dict;
- ``context``: every input item its prompt was built from, in order: the previous
  response's context and output, then the request's own input (a continuation is the
  same prompt as the whole history sent again); instructions are not items, and are not
  carried to a continuation (as OpenAI's);
- ``input_items``: the request's own input items as JSON, each with an ``id``;
- ``frames``: a background response created with ``stream``: its events as sent
  (service/store/background.py), for ``GET ?stream=true``.

Items are shared between the entries of one conversation, not copied. The budget counts
each entry's whole context, shared items as often as entries hold them, so the bytes the
store keeps alive never exceed it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from service.store.fair import victim

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]
    context: tuple[Any, ...]  # validated input items (service.translate.schemas.InputItem)
    input_items: tuple[dict[str, Any], ...]
    nbytes: int  # the context's and the response's JSON bytes, and the frames'
    # a background response created with stream: its events' SSE frames, in order
    # (GET ?stream=true replays them)
    frames: tuple[str, ...] = ()
    seq: int = 0  # the order entries were first put in (listing)

    @property
    def id(self) -> str:
        return self.response["id"]

    @property
    def context_bytes(self) -> int:
        """What a continuation's context counts of this entry: its context and output,
        not its events (a continuation keeps none of them alive)."""
        return self.nbytes - sum(len(f) for f in self.frames)


def _size(entry: StoredResponse) -> int:
    return entry.nbytes


def tenant_of(api_key: str | None) -> str:
    """The store's namespace for a request authenticated by ``api_key`` (None: the server
    takes no keys, one namespace)."""
    if not api_key:
        return ""
    return hashlib.sha256(api_key.encode()).hexdigest()[:32]


def json_bytes(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")))


class ResponseStore:
    """Least recently used stored responses within ``budget_bytes``; every call is made on
    the event loop (no lock)."""

    def __init__(self, budget_bytes: int) -> None:
        if budget_bytes <= 0:
            raise ValueError("a response store needs a positive byte budget")
        self.budget = budget_bytes
        self.used = 0
        self._entries: OrderedDict[tuple[str, str], StoredResponse] = OrderedDict()
        self._seq = 0

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, tenant: str, response_id: str) -> StoredResponse | None:
        """The entry, now the most recently used; None when absent or another key's."""
        entry = self._entries.get((tenant, response_id))
        if entry is not None:
            self._entries.move_to_end((tenant, response_id))
        return entry

    def put(self, tenant: str, response: dict[str, Any], context: Sequence[Any],
            context_bytes: int, input_items: Sequence[dict[str, Any]],
            frames: Sequence[str] = ()) -> bool:
        """Keep ``response`` (``context_bytes``: its context's JSON bytes; ``frames``: a
        background stream's events); False when it alone is over the budget (then
        nothing is evicted for it)."""
        nbytes = context_bytes + json_bytes(response) + sum(len(f) for f in frames)
        if nbytes > self.budget:
            log.warning("response %s not stored: %d bytes of context and output, over the "
                        "store's budget of %d (--responses-store-mib)", response["id"],
                        nbytes, self.budget)
            return False
        self.delete(tenant, response["id"])
        while self.used + nbytes > self.budget:
            key = victim(self._entries, _size, adding=(tenant, nbytes))
            assert key is not None  # the entries hold more than the budget leaves it
            self.used -= self._entries.pop(key).nbytes
        self._seq += 1
        self._entries[(tenant, response["id"])] = StoredResponse(
            response, tuple(context), tuple(input_items), nbytes, tuple(frames), self._seq)
        self.used += nbytes
        return True

    def replace(self, tenant: str, response: dict[str, Any]) -> StoredResponse | None:
        """The entry of ``response["id"]`` with ``response`` in place of its own (its
        place in listings kept); None when absent. A bigger response may evict others."""
        old = self._entries.get((tenant, response["id"]))
        if old is None:
            return None
        grown = json_bytes(response) - json_bytes(old.response)
        new = StoredResponse(response, old.context, old.input_items, old.nbytes + grown,
                             old.frames, old.seq)
        self._entries[(tenant, response["id"])] = new
        self._entries.move_to_end((tenant, response["id"]))
        self.used += grown
        while self.used > self.budget and (key := victim(self._entries, _size, new)):
            self.used -= self._entries.pop(key).nbytes
        return new

    def listing(self, tenant: str) -> list[StoredResponse]:
        """The tenant's entries in the order they were first put."""
        return sorted((e for (t, _), e in self._entries.items() if t == tenant),
                      key=lambda e: e.seq)

    def delete(self, tenant: str, response_id: str) -> bool:
        entry = self._entries.pop((tenant, response_id), None)
        if entry is None:
            return False
        self.used -= entry.nbytes
        return True
