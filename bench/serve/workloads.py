"""The serving benchmark's prompts and cache salts, per workload (no I/O: the drivers are
bench/serve/passes.py).

Workloads:
  random         ``num_prompts`` prompts of ``input_len`` random ids, no shared prefix.
  multi-turn     ``num_prompts`` conversations of ``turns`` turns; each has its own system
                 prompt of ``system_len`` ids. Turn k's prompt is turn k-1's prompt + turn
                 k-1's reply + a new user message of ``input_len`` ids.
  shared-prefix  one system prompt of ``system_len`` ids shared by ``num_prompts``
                 requests, each followed by its own ``input_len`` ids of user text.
  grounded, code-edit, story
                 chat prompts in text (bench/spec/workloads.py: quote a passage,
                 return a function with one change, write a story), turned into ids by
                 the server's POST /tokenize with its chat template; ``input_len`` does
                 not apply. For speculative decoding (``--speculative-config``).

Prompts are token ids, not text (/v1/completions takes a list of ids), so every length is
exact and no tokenizer or chat template is needed (the synth checkpoints have none). The
history is kept as ids too, so turn k-1's prompt is an exact token prefix of turn k's.
The reply is the only part that travels as text: the stream carries text, and the client
turns it back into ids with the server's POST /tokenize, as a chat client resending the
transcript would. Re-encoding may split the reply differently from the ids the model
generated, which only moves where the cached prefix ends inside that reply.

Cache salts (vLLM's ``cache_salt``: requests with different salts never share cached
blocks) make "cache on" and "cache off" two passes against one server:
  cached    one fresh salt shared by every request of the pass: requests of the pass
            share blocks, none from an earlier pass counts (the first turn, or the first
            request of shared-prefix, warms the cache);
  uncached  a fresh salt per request, so nothing is ever found: turn k of a conversation
            cannot reuse turn k-1 and no two requests share the system prompt.
The random workload runs one pass, uncached, so repeated rounds never hit each other's
prompts. Salts are random per run (not seeded), so a second run against the same server
does not find the first run's blocks either.
"""

from __future__ import annotations

import random
import secrets
from collections.abc import Sequence

TEXT_WORKLOADS = ("grounded", "code-edit", "story")
WORKLOADS = ("random", "multi-turn", "shared-prefix", *TEXT_WORKLOADS)
CACHED, UNCACHED = "cached", "uncached"


def passes(workload: str) -> tuple[str, ...]:
    """The passes one round of ``workload`` runs against each server, in order."""
    return (UNCACHED,) if workload in ("random", *TEXT_WORKLOADS) else (CACHED, UNCACHED)


def random_ids(rng: random.Random, n: int, lo: int, hi: int) -> list[int]:
    return [rng.randrange(lo, hi) for _ in range(n)]


def conversations(n: int, turns: int, system_len: int, input_len: int, lo: int, hi: int,
                  seed: int) -> list[tuple[list[int], list[list[int]]]]:
    """``n`` conversations as (system prompt, one user message per turn)."""
    rng = random.Random(seed)
    return [(random_ids(rng, system_len, lo, hi),
             [random_ids(rng, input_len, lo, hi) for _ in range(turns)]) for _ in range(n)]


def turn_prompt(system: Sequence[int], users: Sequence[Sequence[int]],
                replies: Sequence[Sequence[int]]) -> list[int]:
    """The prompt of turn ``len(replies) + 1``: the system prompt, then each earlier
    turn's user message and reply, then this turn's user message."""
    ids = list(system)
    for user, reply in zip(users[:len(replies)], replies, strict=True):
        ids += [*user, *reply]
    return ids + list(users[len(replies)])


def shared_prefix_prompts(n: int, system_len: int, input_len: int, lo: int, hi: int,
                          seed: int) -> list[list[int]]:
    """``n`` prompts: one system prompt, then each request's own user ids."""
    rng = random.Random(seed)
    system = random_ids(rng, system_len, lo, hi)
    return [system + random_ids(rng, input_len, lo, hi) for _ in range(n)]


def pass_salts(mode: str, n: int, per_item: int = 1) -> list[list[str]]:
    """``cache_salt`` of each of ``per_item`` requests (turns) of ``n`` conversations or
    requests: one fresh salt for all (cached), or a fresh one per request (uncached)."""
    if mode == CACHED:
        shared = secrets.token_hex(8)
        return [[shared] * per_item for _ in range(n)]
    if mode == UNCACHED:
        return [[secrets.token_hex(8) for _ in range(per_item)] for _ in range(n)]
    raise ValueError(f"unknown pass {mode!r}")
