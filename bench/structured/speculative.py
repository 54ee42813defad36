"""Speculative decoding under a grammar against plain constrained decoding:
``fp8serve bench structured --speculative-config ...``.

Three workloads (chat prompts, greedy, every request constrained):

* extraction: a json_schema whose fields are filled from a passage in the prompt;
* tool-args: a forced call (the tokenizer's tool style: hermes or mistral) whose
  ``quote`` argument copies a paragraph of the prompt;
* free-json: any JSON object (json_object) describing something invented: nothing to copy.

For each workload and concurrency, the two modes run at once, each on its own runner (the
checkpoint loaded twice), stepping alternately, so the host's load changes hit both alike;
``rounds`` rounds, the modes swapping runners every round. All prompts of a mode are
prefilled in its first step; decode tokens/s = tokens of the steps after every request has
its first token / their time (the grammar ends a request when its JSON is complete).
Reported per (workload, C): the median of the rounds' speculative / plain ratios, whether
the outputs were identical (they must be), tokens per step of each mode (independent of
the host's load), acceptance, forced draft tokens, and the grammar masks: one mask fill's
time against a plain constrained decode step, and mask fills per draft position (at most
1: a K-token draft fills K + 1 masks, one of them the plain step's own). ``oracle``:
drafts from the plain output (bench/spec/run.py ReplayProposer, "right": all kept,
"wrong": all rejected), for random-weight checkpoints whose text means nothing.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.spec.run import ReplayProposer, check_spec_bench, json_spec, load, step_budget
from bench.spec.workloads import PASSAGE
from engine.spec.config import SpeculativeConfig

Log = Callable[[str], object]
EXTRACT = {"type": "object", "additionalProperties": False,
           "required": ["town", "year_built", "what_the_ledgers_record", "cargo_season"],
           "properties": {"town": {"type": "string"}, "year_built": {"type": "integer"},
                          "what_the_ledgers_record": {"type": "string"},
                          "cargo_season": {"type": "string"}}}
QUOTE_TOOL = {"type": "function", "function": {
    "name": "save_quote", "description": "Save a paragraph quoted word for word",
    "parameters": {"type": "object", "additionalProperties": False, "required": ["quote"],
                   "properties": {"quote": {"type": "string"}}}}}
ASKS = {
    "extraction": "Here is a passage:\n\n" + PASSAGE + "\nFill in the JSON fields by "
                  "copying the exact words of the passage.",
    "tool-args": "Here is a passage:\n\n" + PASSAGE + "\nSave the second paragraph of the "
                 "passage as a quote, word for word.",
    "free-json": "Invent a new board game and describe it as a JSON object.",
}
WORKLOADS = tuple(ASKS)


@dataclass(frozen=True)
class StructuredSpecConfig:
    model_dir: Path
    spec: SpeculativeConfig
    workloads: tuple[str, ...] = WORKLOADS
    concurrency: tuple[int, ...] = (1,)
    gen_len: int = 128
    rounds: int = 2
    threads: int | None = None
    oracle: str | None = None  # None | "right" | "wrong"

    def __post_init__(self) -> None:
        check_spec_bench(self, WORKLOADS)


def workload(name: str, tok: Any, i: int = 0) -> tuple[list[int], Any]:
    """(prompt ids of request i, its GrammarSpec)."""
    from engine.structured import json_object_spec, json_schema_spec, tool_call_grammar

    msgs = [{"role": "user", "content": f"Request {i}.\n{ASKS[name]}"}]
    if name == "extraction":
        return tok.encode_chat(msgs), json_schema_spec(EXTRACT, "extraction")
    if name == "free-json":
        return tok.encode_chat(msgs), json_object_spec()
    style = "mistral" if tok.token_to_id("[TOOL_CALLS]") is not None else "hermes"
    named = {"type": "function", "function": {"name": "save_quote"}}
    return (tok.encode_chat(msgs, tools=[QUOTE_TOOL]),
            tool_call_grammar([QUOTE_TOOL], named, False, style, tok))


class _Pass:
    """One mode's pass: an engine on its own runner, C constrained requests, and the time
    and steps of its decode phase (the steps after every request has its first token)."""

    def __init__(self, runner: Any, tok: Any, cfg: StructuredSpecConfig,
                 spec: SpeculativeConfig | None, prompts: list[list[int]], grammar: Any,
                 proposer: Any = None) -> None:
        from engine.config import EngineConfig
        from engine.engine import Engine
        from engine.sampling_params import SamplingParams

        ecfg = EngineConfig(model_dir=cfg.model_dir, max_num_seqs=len(prompts),
                            max_model_len=runner.engine_config.max_model_len,
                            max_num_batched_tokens=step_budget(prompts),
                            enable_prefix_caching=False, speculative_config=spec)
        self.engine = eng = Engine(runner, tok, ecfg)
        self.speculative = spec is not None
        if proposer is not None and spec is not None:
            eng.spec.proposer = proposer
        self.outs: list[list[int]] = [[] for _ in prompts]
        self.finished = [False] * len(prompts)
        params = SamplingParams(max_tokens=cfg.gen_len, temperature=0.0, grammar=grammar,
                                skip_special_tokens=False)
        for i, p in enumerate(prompts):
            def sink(o, i=i):
                self.outs[i].extend(o.token_ids)
                self.finished[i] = self.finished[i] or o.finished
            eng.add_request(f"r{i}", p, params, sink)
        self.decode_s = self.mask_s = 0.0
        self.steps = self.tokens = self.mask_fills = 0

    @property
    def done(self) -> bool:
        return all(self.finished)

    def step(self) -> None:
        decoding = all(self.outs)
        before = sum(map(len, self.outs))
        fills0, mask0 = self.engine.steps.mask_fills, self.engine.steps.mask_time_s
        t0 = time.perf_counter()
        self.engine.step()
        if decoding:
            self.decode_s += time.perf_counter() - t0
            self.steps += 1
            self.tokens += sum(map(len, self.outs)) - before
            self.mask_fills += self.engine.steps.mask_fills - fills0
            self.mask_s += self.engine.steps.mask_time_s - mask0

    def result(self) -> dict[str, Any]:
        res: dict[str, Any] = {"decode_tok_s": self.tokens / self.decode_s,
                               "decode_s": self.decode_s, "steps": self.steps,
                               "tokens": self.tokens, "outputs": self.outs,
                               "mask_fills": self.mask_fills, "mask_s": self.mask_s,
                               "draft_mask_fills": self.engine.steps.draft_mask_fills}
        if self.speculative:
            s = self.engine.spec.stats
            res["spec"] = {"num_drafts": s.num_drafts, "num_draft_tokens": s.num_draft_tokens,
                           "num_accepted_tokens": s.num_accepted_tokens,
                           "acceptance_rate": s.acceptance_rate,
                           "num_forced_tokens": s.num_forced_tokens,
                           "num_cut_tokens": s.num_cut_tokens}
        return res


def _paired(runners: list[Any], tok: Any, cfg: StructuredSpecConfig, prompts: list[list[int]],
            grammar: Any, refs: Any) -> dict[str, dict[str, Any]]:
    """Both modes at once, one runner each, stepping alternately (which goes first
    alternates too), so the host's load changes hit both alike. ``refs``: prompt -> the
    plain output, for the oracle's drafts."""
    replay = None
    if cfg.oracle and refs is not None:
        replay = ReplayProposer(refs, wrong=cfg.oracle == "wrong")
    passes = {"off": _Pass(runners[0], tok, cfg, None, prompts, grammar),
              "on": _Pass(runners[1], tok, cfg, cfg.spec, prompts, grammar, replay)}
    order = list(passes.values())
    while not all(p.done for p in order):
        for p in order:
            if not p.done:
                p.step()
        order.reverse()
    return {m: p.result() for m, p in passes.items()}


def run_structured_spec_bench(cfg: StructuredSpecConfig, log: Log = print) -> dict[str, Any]:
    import torch

    from engine.structured import compiler_for
    from engine.text.tokenizer import Tokenizer

    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    tok = Tokenizer.from_dir(cfg.model_dir)
    jobs = {(w, c): [workload(w, tok, i) for i in range(c)]
            for w in cfg.workloads for c in cfg.concurrency}
    log(f"loading {cfg.model_dir} twice (a runner per mode)")
    longest = max(len(p) for js in jobs.values() for p, _ in js)
    runners = [load(cfg, longest)[0] for _ in range(2)]
    rows = []
    for (w, c), js in jobs.items():
        prompts = [p for p, _ in js]
        grammar = compiler_for(tok).compile(js[0][1])
        refs = None
        if cfg.oracle:  # the plain output the oracle drafts from
            refs = dict(zip(map(tuple, prompts), _paired(runners, tok, cfg, prompts, grammar,
                                                         None)["off"]["outputs"], strict=True))
        passes: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
        for r in range(cfg.rounds):  # the modes swap runners every round
            got = _paired(runners[::-1] if r % 2 else runners, tok, cfg, prompts, grammar,
                          refs)
            for mode, res in got.items():
                passes[mode].append(res)
                log(f"{w} c={c} round {r + 1} {mode}: {res['decode_tok_s']:.1f} decode "
                    f"tok/s, {res['steps']} steps")
        rows.append(_row(w, c, passes))
    return {"schema": 1, "config": {k: (str(v) if isinstance(v, Path) else v)
                                    for k, v in asdict(cfg).items()} | {
                                        "spec": json_spec(cfg.spec)},
            "threads": torch.get_num_threads(), "rows": rows}


def _row(w: str, c: int, passes: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    off = statistics.median(p["decode_tok_s"] for p in passes["off"])
    on = statistics.median(p["decode_tok_s"] for p in passes["on"])
    paired = [b["decode_tok_s"] / a["decode_tok_s"]  # the two modes of one round
              for a, b in zip(passes["off"], passes["on"], strict=True)]
    same = all(p["outputs"] == passes["off"][0]["outputs"]
               for p in passes["off"] + passes["on"])
    fill_s = statistics.median(p["mask_s"] / p["mask_fills"] for p in passes["on"]
                               if p["mask_fills"])
    step_s = statistics.median(p["decode_s"] / p["steps"] for p in passes["off"])
    last = passes["on"][-1]
    s = last["spec"]
    return {"workload": w, "concurrency": c, "plain_decode_tok_s": off,
            "spec_decode_tok_s": on, "speedup": statistics.median(paired),
            "round_speedups": paired, "outputs_identical": same,
            "tokens_per_step": {m: statistics.median(p["tokens"] / p["steps"] for p in ps)
                                for m, ps in passes.items()},
            "mask_fill_s": fill_s, "plain_step_s": step_s, "fill_per_step": fill_s / step_s,
            "draft_fills_per_draft_token": (last["draft_mask_fills"] / s["num_draft_tokens"]
                                            if s["num_draft_tokens"] else 0.0),
            "spec": s, "passes": {m: [{k: v for k, v in p.items() if k != "outputs"}
                                      for p in ps] for m, ps in passes.items()}}


def format_table(res: dict[str, Any]) -> str:
    lines = [f"constrained decoding, speculative {res['config']['spec']} against plain"
             f"{' (oracle ' + res['config']['oracle'] + ')' if res['config']['oracle'] else ''}"
             f", {res['threads']} threads, gen_len {res['config']['gen_len']}, median of "
             f"{res['config']['rounds']} interleaved rounds",
             f"{'workload':<11}{'C':>4}{'plain tok/s':>13}{'spec tok/s':>12}{'x':>7}"
             f"{'tok/step':>10}{'accept':>8}{'forced':>8}{'fill/step':>11}"
             f"{'identical':>11}"]
    for r in res["rows"]:
        s = r["spec"]
        lines.append(f"{r['workload']:<11}{r['concurrency']:>4}{r['plain_decode_tok_s']:>13.1f}"
                     f"{r['spec_decode_tok_s']:>12.1f}{r['speedup']:>7.2f}"
                     f"{r['tokens_per_step']['on']:>10.2f}"
                     f"{s['acceptance_rate']:>8.2f}{s['num_forced_tokens']:>8}"
                     f"{r['fill_per_step']:>11.2%}{str(r['outputs_identical']):>11}")
    lines.append("(x: median over rounds of speculative / plain constrained decode "
                 "tokens/s, the modes stepping alternately; tok/step: tokens per decode step "
                 "with speculation (1 plain); forced: draft tokens the grammar forced; "
                 "fill/step: one grammar mask fill over a plain constrained decode step)")
    return "\n".join(lines)
