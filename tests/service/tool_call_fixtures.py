"""Shared helpers for the tool-call parser tests: the tiny synth checkpoint's v13 Tekken
tokenizer, deterministic call ids, every way to cut a stream into steps, and a client-side
reassembly of streamed deltas."""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from engine.synth import SynthSpec, write_checkpoint
from engine.text.tokenizer import Tokenizer
from service.tool_calls import DeltaMessage, OutputParser, ParsedMessage, ToolCall


def tekken_tokenizer(tmp: Path) -> Tokenizer:
    write_checkpoint(tmp, SynthSpec.preset("tiny", tokenizer="tekken"))
    return Tokenizer.from_dir(tmp)


def counter_ids() -> Callable[[], str]:
    n = itertools.count()
    return lambda: f"id{next(n):07d}"


def cuts(n: int, limit: int = 12, samples: int = 300, seed: int = 0) -> Iterator[list[int]]:
    """Step sizes: every composition of n when n <= limit, else random ones (plus the
    one-token and one-step extremes)."""
    if n <= limit:
        for mask in range(1 << max(n - 1, 0)):
            sizes, run = [], 1
            for bit in range(n - 1):
                if mask >> bit & 1:
                    sizes.append(run)
                    run = 1
                else:
                    run += 1
            yield [*sizes, run] if n else []
        return
    rng = random.Random(seed)
    yield [1] * n
    yield [n]
    for _ in range(samples):
        sizes, left = [], n
        while left:
            sizes.append(rng.randint(1, min(left, 6)))
            left -= sizes[-1]
        yield sizes


def stream(parser: OutputParser, ids: Sequence[int], sizes: Sequence[int]) -> list[DeltaMessage]:
    deltas, pos = [], 0
    for size in sizes:
        deltas.append(parser.feed(ids[pos:pos + size]))
        pos += size
    return [*deltas, parser.finish()]


def reassemble(deltas: Sequence[DeltaMessage]) -> ParsedMessage:
    """What a client builds from the deltas; checks each call's first delta is complete
    and that a delta holds one entry per call index (as OpenAI's stream does)."""
    msg = ParsedMessage()
    for d in deltas:
        msg.content += d.content
        msg.reasoning_content += d.reasoning_content
        indexes = [t.index for t in d.tool_calls]
        assert len(indexes) == len(set(indexes)), d
        for t in d.tool_calls:
            if t.id is not None:
                assert t.index == len(msg.tool_calls) and t.name
                wire = t.to_openai()
                assert wire["type"] == "function"
                assert wire["function"]["arguments"] == t.arguments
                msg.tool_calls.append(ToolCall(t.id, t.name, t.arguments))
            else:
                assert t.to_openai() == {"index": t.index, "function": {"arguments": t.arguments}}
                msg.tool_calls[t.index].arguments += t.arguments
    return msg
