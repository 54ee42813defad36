"""The three workloads speculative decoding is measured on (chat prompts, plain text):

* grounded: answer a question about a passage given in the prompt by quoting it (RAG
  answers that cite their sources);
* code-edit: return a given function with one change;
* story: open-ended writing, nothing in the prompt to copy.

``PREDICTIONS``: each workload's predicted output for ``--prediction text`` (the passage,
the function as given).

``workload_messages(name, i)`` varies request ``i`` by a leading line, so concurrent
requests are distinct prompts (no prefix-cache sharing between them)."""

from __future__ import annotations

PASSAGE = """\
The harbour town of Lenmouth grew up around a single stone quay built in 1742 by a \
merchant who traded salt for timber. For a century the quay was the only place on that \
stretch of coast where a ship could unload at low tide, and the town's fortunes rose and \
fell with the timber trade. When the railway arrived in 1868 the quay lost most of its \
traffic within a decade; the warehouses along the water were turned into net lofts, and \
later into the small museum that now holds the merchant's ledgers.

The ledgers record every cargo that crossed the quay between 1742 and 1811: the ship, its \
master, the weight of salt delivered and the timber taken in exchange. Historians have \
used them to show that the trade was far more seasonal than once believed. Nearly three \
quarters of all cargoes arrived between May and September, and in the worst winters no \
ship came at all for four months. The merchant's letters, kept with the ledgers, complain \
of the cost of idle warehouses and of crews who would not sail before the spring gales \
had passed.
"""

FUNCTION = '''\
def summarize_orders(orders, min_total=0.0):
    """Group orders by customer and return the customers whose total reaches min_total."""
    totals = {}
    counts = {}
    for order in orders:
        customer = order["customer"]
        amount = float(order["amount"])
        if amount < 0:
            raise ValueError(f"negative amount in order {order['id']}")
        totals[customer] = totals.get(customer, 0.0) + amount
        counts[customer] = counts.get(customer, 0) + 1
    result = []
    for customer, total in sorted(totals.items()):
        if total >= min_total:
            result.append({"customer": customer, "total": round(total, 2),
                           "orders": counts[customer]})
    return result
'''

PROMPTS = {
    "grounded": ("Here is a passage:\n\n" + PASSAGE + "\nWhat do the ledgers record? "
                 "Answer by quoting the passage word for word."),
    "code-edit": ("Here is a Python function:\n\n" + FUNCTION + "\nReturn the same function "
                  "with the variable `totals` renamed to `sums`, and nothing else changed. "
                  "Reply with the code only."),
    "story": ("Write a long, original story about a lighthouse keeper who finds a "
              "strange machine washed up on the rocks."),
}
WORKLOADS = tuple(PROMPTS)
# what a client would send as the predicted output (OpenAI's ``prediction``): the text the
# answer is asked to quote or edit; the story has none
PREDICTIONS = {"grounded": PASSAGE, "code-edit": FUNCTION}


def workload_messages(name: str, i: int = 0) -> list[dict[str, str]]:
    if name not in PROMPTS:
        raise ValueError(f"unknown workload {name!r}; choose from {', '.join(WORKLOADS)}")
    return [{"role": "user", "content": f"Request {i}.\n{PROMPTS[name]}"}]
