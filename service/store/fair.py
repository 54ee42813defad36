"""Which entry a store over its byte budget evicts, when several API keys share it: the
least recently used entry of the key whose entries hold the most bytes. A key that fills
the store evicts its own oldest entries, not another key's; with one key (a server that
takes none, or a single client) this is plain least-recently-used order.

The stores (service/store/responses.py, conversations.py) key their entries by
``(tenant, id)`` in an OrderedDict, least recently used first; the bytes each tenant
holds are summed when an eviction is needed (entries change size in place, so a running
count per tenant would have to follow every change).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import TypeVar

E = TypeVar("E")
Key = tuple[str, str]


def victim(entries: OrderedDict[Key, E], size: Callable[[E], int], keep: E | None = None,
           adding: tuple[str, int] = ("", 0)) -> Key | None:
    """The key of the entry to evict from ``entries``: the oldest of the tenant holding the
    most bytes (``adding``: a tenant's entry on its way in, counted as held; ties go to
    the tenant with the older entry), never ``keep``. None when nothing can be evicted."""
    held: dict[str, int] = {}
    for (tenant, _), entry in entries.items():
        held[tenant] = held.get(tenant, 0) + size(entry)
    if adding[0] in held:
        held[adding[0]] += adding[1]
    for tenant in sorted(held, key=lambda t: -held[t]):
        for key, entry in entries.items():
            if key[0] == tenant and entry is not keep:
                return key
    return None
