"""Constrained (json_schema) vs unconstrained decode throughput through the engine, in one
process, interleaved step by step: each mode has its own engine and runner (the same
checkpoint loaded twice) and the two engines take turns, one step each, so the host's
load changes hit both modes alike. Reported as ratios.

Decode tokens/s of a mode = tokens its decode steps produced (the steps after every request
has its first token) / the time those steps took. Both modes generate exactly ``gen_len`` tokens per
request: unconstrained rows ignore EOS, and the constrained schema (an array of at least
100 people objects: strings, integers, enums, nested arrays) cannot finish before that.
The ratio is the median over rounds of the two modes' ratio within the round. The mask
share is the time spent filling grammar masks / the decode time (applying them in the
sampler is ~1 ms for 16 x 49k logits).
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

Log = Callable[[str], object]
PERSON = {"type": "object", "additionalProperties": False,
          "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                         "color": {"enum": ["red", "green", "blue"]},
                         "tags": {"type": "array", "items": {"type": "string"}}},
          "required": ["name", "age", "color", "tags"]}
SCHEMA = {"type": "object", "additionalProperties": False, "required": ["people"],
          "properties": {"people": {"type": "array", "minItems": 100, "items": PERSON}}}
PROMPT = "List one hundred people as JSON, with their name, age, favourite color and tags."


@dataclass(frozen=True)
class StructuredBenchConfig:
    model_dir: Path
    concurrency: tuple[int, ...] = (1, 16)
    gen_len: int = 48
    rounds: int = 3
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.gen_len < 4 or self.rounds < 1:
            raise ValueError("need gen_len >= 4 and rounds >= 1")
        if not self.concurrency or min(self.concurrency) < 1:
            raise ValueError(f"bad concurrency {self.concurrency}")


@dataclass(frozen=True)
class RunResult:
    mode: str  # "constrained" | "unconstrained"
    concurrency: int
    decode_tok_s: float
    mask_share: float  # mask fill time / decode time
    valid_prefix: bool  # every constrained output so far parses as a JSON prefix


class _Side:
    """One mode's engine: its requests, and the time and tokens of its decode steps (the
    steps after every request has its first token)."""

    def __init__(self, runner: Any, tok: Any, cfg: Any, prompt: list[int], n: int,
                 gen_len: int, grammar: Any) -> None:
        from engine.engine import Engine
        from engine.sampling_params import SamplingParams

        self.engine = Engine(runner, tok, cfg)
        self.outs: list[list] = [[] for _ in range(n)]
        params = SamplingParams(max_tokens=gen_len, temperature=0.0, ignore_eos=True,
                                grammar=grammar)
        for i, sink in enumerate(self.outs):
            self.engine.add_request(f"r{i}", prompt, params, sink.append)
        self.decode_s = self.mask_s = 0.0
        self.tokens = 0

    @property
    def done(self) -> bool:
        return not (self.engine._live or self.engine.stats().num_waiting)

    def step(self) -> None:
        decoding = all(self.outs)
        before, mask0 = sum(map(len, self.outs)), self.engine.steps.mask_time_s
        t0 = time.perf_counter()
        self.engine.step()
        if decoding:
            self.decode_s += time.perf_counter() - t0
            self.tokens += sum(map(len, self.outs)) - before
            self.mask_s += self.engine.steps.mask_time_s - mask0

    def texts(self) -> list[str]:
        return ["".join(o.text for o in v) for v in self.outs]


def _paired_run(runners: list[Any], tok: Any, cfg: Any, prompt: list[int], n: int,
                gen_len: int, grammar: Any) -> dict[str, _Side]:
    """Both modes at once, one engine (and runner) each, stepping alternately (which goes
    first alternates too), so the host's load changes hit both modes alike."""
    sides = {"unconstrained": _Side(runners[0], tok, cfg, prompt, n, gen_len, None),
             "constrained": _Side(runners[1], tok, cfg, prompt, n, gen_len, grammar)}
    order = list(sides.values())
    while not all(s.done for s in order):
        for side in order:
            if not side.done:
                side.step()
        order.reverse()
    return sides


def _plausible_json_prefix(text: str) -> bool:
    head = '{"people": ['
    return bool(text) and (text.startswith(head) or head.startswith(text))


def run_structured_bench(cfg: StructuredBenchConfig, log: Log = print) -> dict[str, Any]:
    import torch

    from engine.config import EngineConfig
    from engine.runner import load_runner
    from engine.structured import compiler_for, json_schema_spec
    from engine.text.tokenizer import Tokenizer

    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    ecfg = EngineConfig(model_dir=cfg.model_dir, max_num_seqs=max(cfg.concurrency),
                        max_model_len=512, kv_cache_gib=0.25, enable_prefix_caching=False)
    runners = [load_runner(cfg.model_dir, ecfg) for _ in range(2)]  # own KV store each
    tok = Tokenizer.from_dir(cfg.model_dir)
    prompt = tok.encode_chat([{"role": "user", "content": PROMPT}])
    grammar = compiler_for(tok).compile(json_schema_spec(SCHEMA, "people"))
    _paired_run(runners, tok, ecfg, prompt, 1, 4, grammar)  # warm-up
    runs: list[RunResult] = []
    for r in range(cfg.rounds):
        for n in cfg.concurrency:  # the modes swap runners every round
            sides = _paired_run(runners[::-1] if r % 2 else runners, tok, ecfg, prompt, n,
                                cfg.gen_len, grammar)
            for mode, side in sides.items():
                ok = mode == "unconstrained" or all(map(_plausible_json_prefix,
                                                        side.texts()))
                tps = side.tokens / side.decode_s
                runs.append(RunResult(mode, n, tps, side.mask_s / side.decode_s, ok))
                log(f"round {r + 1} c={n:<3} {mode:<13} {tps:8.1f} tok/s"
                    + (f"  mask {side.mask_s / side.decode_s:.1%}" if mode != "unconstrained"
                       else ""))
    return _summary(cfg, runs, torch.get_num_threads())


def _summary(cfg: StructuredBenchConfig, runs: list[RunResult], threads: int
             ) -> dict[str, Any]:
    rows = []
    for n in cfg.concurrency:
        got = {m: [x for x in runs if x.mode == m and x.concurrency == n]
               for m in ("unconstrained", "constrained")}
        free = statistics.median(x.decode_tok_s for x in got["unconstrained"])
        held = statistics.median(x.decode_tok_s for x in got["constrained"])
        paired = [c.decode_tok_s / u.decode_tok_s  # the two modes of one round
                  for u, c in zip(got["unconstrained"], got["constrained"], strict=True)]
        rows.append({"concurrency": n, "unconstrained_tok_s": free,
                     "constrained_tok_s": held, "ratio": statistics.median(paired),
                     "round_ratios": paired,
                     "mask_share": statistics.median(x.mask_share for x in got["constrained"]),
                     "outputs_valid": all(x.valid_prefix for x in got["constrained"])})
    return {"config": {k: (str(v) if isinstance(v, Path) else v)
                       for k, v in asdict(cfg).items()},
            "host": {"machine": platform.machine(), "torch_threads": threads},
            "rows": rows, "runs": [asdict(x) for x in runs]}


def format_table(res: dict[str, Any]) -> str:
    c = res["config"]
    lines = [f"{Path(c['model_dir']).name}: gen {c['gen_len']} tokens/request, "
             f"{c['rounds']} interleaved rounds (medians), "
             f"{res['host']['torch_threads']} threads",
             f"{'concurrency':>11}{'free tok/s':>12}{'json tok/s':>12}{'ratio':>8}"
             f"{'mask share':>12}{'valid':>7}"]
    for row in res["rows"]:
        lines.append(f"{row['concurrency']:>11}{row['unconstrained_tok_s']:>12.1f}"
                     f"{row['constrained_tok_s']:>12.1f}{row['ratio']:>8.3f}"
                     f"{row['mask_share']:>12.1%}{str(row['outputs_valid']):>7}")
    lines.append("(ratio = median over rounds of constrained / unconstrained decode tok/s, "
                 "the two modes stepping alternately; tok/s columns are medians; the host is "
                 "shared: compare ratios, not absolute figures)")
    return "\n".join(lines)
