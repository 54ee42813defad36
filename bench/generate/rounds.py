"""Interleaved rounds of timed generations for `fp8serve bench generate`: every engine is
loaded once, then each round times one greedy generation per engine, the order reversed
every other round (A B C, C B A, ...), with a read-bandwidth sample right before and
right after each generation. On a shared host the per-round ratios (both engines timed
minutes apart at most) are the figures that mean something; their median is reported."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bench.common.read_probe import ReadProbe
from bench.generate.gen_timing import GenTiming

Generate = Callable[[list[int], int], GenTiming]


@dataclass(frozen=True)
class Contender:
    name: str
    generate: Generate  # (prompt ids, tokens to generate) -> GenTiming


def run_rounds(contenders: list[Contender], prompt: list[int], gen_len: int, rounds: int,
               probe: ReadProbe, samples: list[dict[str, Any]],
               log: Callable[[str], object] = print) -> dict[str, list[GenTiming]]:
    """{name: [GenTiming per round]}; samples labelled 'before NAME' / 'after NAME'."""
    out: dict[str, list[GenTiming]] = {c.name: [] for c in contenders}
    for r in range(rounds):
        order = contenders if r % 2 == 0 else contenders[::-1]
        for c in order:
            samples.append(probe.sample(f"before {c.name}"))
            t = c.generate(prompt, gen_len)
            samples.append(probe.sample(f"after {c.name}"))
            out[c.name].append(t)
            log(f"round {r} {c.name}: prefill {t.prefill_tps:.1f} tok/s, "
                f"decode {t.decode_tps:.2f} tok/s")
    return out


def median_round(timings: list[GenTiming]) -> GenTiming:
    """The round with the median decode speed (the lower median for an even count)."""
    ranked = sorted(timings, key=lambda t: t.decode_tps)
    return ranked[(len(ranked) - 1) // 2]


def per_round(timings: list[GenTiming]) -> dict[str, list[float]]:
    return {"prefill_tok_s": [t.prefill_tps for t in timings],
            "decode_tok_s": [t.decode_tps for t in timings]}


def round_ratios(ours: list[GenTiming], theirs: list[GenTiming]) -> dict[str, Any]:
    """fp8serve / other, prefill and decode, within each round, and their medians."""
    dec = [a.decode_tps / b.decode_tps for a, b in zip(ours, theirs, strict=True)]
    pre = [a.prefill_tps / b.prefill_tps for a, b in zip(ours, theirs, strict=True)]
    return {"decode": dec, "prefill": pre, "decode_median": statistics.median(dec),
            "prefill_median": statistics.median(pre)}
