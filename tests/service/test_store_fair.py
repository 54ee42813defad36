"""The stores' eviction when several API keys share one (service/store/fair.py): a key
that fills a store evicts its own oldest entries, not another key's; once another key
holds the most bytes, its oldest goes."""

from __future__ import annotations

from collections import OrderedDict

from service.store.conversations import ConversationStore
from service.store.fair import victim
from service.store.responses import ResponseStore, tenant_of
from tests.service.test_responses_store import _resp, _size

A, B = tenant_of("key-a"), tenant_of("key-b")


def test_the_oldest_of_the_key_holding_the_most_goes():
    entries = OrderedDict([((B, "b0"), 5), ((A, "a0"), 3), ((A, "a1"), 4), ((B, "b1"), 1)])
    assert victim(entries, int) == (A, "a0")  # a 7, b 6
    assert victim(entries, int, adding=(B, 2)) == (B, "b0")  # b 8 with its new entry
    assert victim(entries, int, adding=(B, 1)) == (B, "b0")  # 7 each: b's entry is older
    assert victim(entries, int, keep=3) == (A, "a1")  # never the entry kept
    one = OrderedDict([((A, "a0"), 3)])
    assert victim(one, int, keep=3) is None and victim(OrderedDict(), int) is None


def test_a_key_that_fills_the_store_evicts_its_own_entries_first():
    """Key b's older entry survives key a filling the store: a's oldest go first while a
    holds the most bytes (an entry on its way in counted as its key's); once b holds
    more, b's oldest goes."""
    a, b = tenant_of("key-a"), tenant_of("key-b")
    store = ResponseStore(4 * _size("r0", 100))
    assert store.put(b, _resp("b0", 100), (), 0, ())
    for k in range(8):
        assert store.put(a, _resp(f"r{k}", 100), (), 0, ())
    assert [r.id for r in store.listing(b)] == ["b0"]
    assert [r.id for r in store.listing(a)] == ["r5", "r6", "r7"]
    assert store.put(b, _resp("b1", 100), (), 0, ())  # a 3, b 2 with it: a's goes
    assert [r.id for r in store.listing(a)] == ["r6", "r7"]
    assert store.put(b, _resp("b2", 100), (), 0, ())  # a 2, b 3 with it: b's goes
    assert [r.id for r in store.listing(a)] == ["r6", "r7"]
    assert [r.id for r in store.listing(b)] == ["b1", "b2"]
    assert store.used == store.budget




def test_conversations_of_a_key_that_fills_the_store_go_first():
    store = ConversationStore(8_000)  # three of a's conversations fit, not four
    kept = store.create(B, {})
    a_convs = []
    for _ in range(4):
        conv = store.create(A, {})
        store.append(A, conv, ["item"], [{"id": "i", "pad": "x" * 2000}])
        a_convs.append(conv)
    assert store.get(B, kept.id) is kept  # a's oldest went: a held the most
    assert store.get(A, a_convs[0].id) is None and store.get(A, a_convs[-1].id) is not None
    assert store.used <= store.budget
    store.append(B, kept, ["item"] * 2, [{"id": f"i{k}", "pad": "x" * 2000}
                                           for k in range(2)])
    # b now holds about two of a's: a's go while a holds more, b's grown one is kept
    assert store.get(B, kept.id) is kept
    assert [store.get(A, c.id) is not None for c in a_convs] == [False] * 3 + [True]
    assert store.used <= store.budget
