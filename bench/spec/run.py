"""Speculative decoding against plain decoding on the same engine, model and prompts:
``fp8serve bench generate --speculative-config ...``.

For each workload (bench/spec/workloads.py) and concurrency C, passes without and
with speculation alternate for ``rounds`` rounds over one loaded runner. A pass admits C
chat requests (greedy, up to ``gen_len`` tokens, EOS ends them) and prefills all of them in
one step (the step budget is raised to their prompt tokens), so every request starts
decoding at the same step in both modes; then it times the steps until all finish: decode
tokens/s = tokens produced in that phase / its wall time. Reported per (workload, C): the
median of each mode, their ratio, whether the outputs were identical (they must be: greedy),
and for speculation the drafts, acceptance rate and tokens per sequence-step (1.0 = plain).
Every figure comes from this run; ratios are the only thing comparable on a shared host.

``oracle``: the speculative passes draft with :class:`ReplayProposer` instead of the
configured n-gram lookup, from the greedy output of the plain pass just before. "right"
replays it, so every draft token is kept: the ratio is the ceiling that verify steps allow
on this host and model, whatever the text. "wrong" drafts a different token (the id with
its lowest bit flipped) at every position, so every draft is rejected at once: the ratio
is the floor the draft policy's backoff and waste budget leave. The draft lengths still
come from the policy. (For random-weight checkpoints, whose text says nothing about real
acceptance.)

``prediction`` (``--prediction``): the second passes give each request a predicted output
(OpenAI's ``prediction``, engine/spec/prediction.py), with the speculative config's n-gram
lookup as well when one is given, else alone. "text": the workload's text the prompt asks
to quote or edit (bench/spec/workloads.py PREDICTIONS), what a client would send; "answer":
the plain pass's own output, so every prediction token is right (the ceiling of predicted
outputs on this host and model)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.spec.workloads import PREDICTIONS, WORKLOADS, workload_messages
from engine.spec.config import SpeculativeConfig
from engine.spec.decoder import PREDICTION_DRAFT_TOKENS
from engine.spec.proposer import DraftInput, Proposer
from engine.stream import EngineObserver

Log = Callable[[str], object]


def check_spec_bench(cfg: Any, known: tuple[str, ...]) -> None:
    """The checks every speculative benchmark config makes of its fields (workloads
    among ``known``, oracle, gen_len, rounds, concurrency); ValueError names the field."""
    unknown = sorted(set(cfg.workloads) - set(known))
    if unknown:
        raise ValueError(f"unknown workload(s) {unknown}; choose from {list(known)}")
    if cfg.oracle not in (None, "right", "wrong"):
        raise ValueError(f"oracle must be right or wrong, got {cfg.oracle!r}")
    if cfg.gen_len < 2 or cfg.rounds < 1 or min(cfg.concurrency, default=0) < 1:
        raise ValueError("need gen_len >= 2, rounds >= 1 and concurrency >= 1")


PREDICTION_MODES = ("text", "answer")


@dataclass(frozen=True)
class SpecBenchConfig:
    model_dir: Path
    spec: SpeculativeConfig | None  # None: predictions alone (``prediction`` set)
    workloads: tuple[str, ...] = WORKLOADS
    concurrency: tuple[int, ...] = (1, 16)
    gen_len: int = 128
    rounds: int = 2
    threads: int | None = None
    oracle: str | None = None  # None | "right" | "wrong"
    prediction: str | None = None  # None | "text" | "answer" (module docstring)

    def __post_init__(self) -> None:
        check_spec_bench(self, WORKLOADS)
        if self.prediction not in (None, *PREDICTION_MODES):
            raise ValueError(f"prediction must be one of {', '.join(PREDICTION_MODES)}, "
                             f"got {self.prediction!r}")
        if self.spec is None and self.prediction is None:
            raise ValueError("give a speculative config or a prediction mode to compare with")
        if self.prediction is not None and self.oracle is not None:
            raise ValueError("an oracle replaces the drafts' source: not with a prediction")
        if self.prediction == "text":
            missing = [w for w in self.workloads if w not in PREDICTIONS]
            if missing:
                raise ValueError(f"workload(s) {missing} have no text to predict; with "
                                 f"--prediction text choose from {list(PREDICTIONS)}")


class ReplayProposer:
    """Drafts from a known continuation (the Proposer interface, engine/spec/proposer.py):
    ``refs`` maps a prompt to the output a plain pass gave it. A sequence whose output so far
    (and the draft's forced head, ``DraftInput.prefix``) is a prefix of its prompt's
    reference gets the reference's next tokens (``wrong``: each with its lowest bit
    flipped, so never the token), any other nothing."""

    def __init__(self, refs: dict[tuple[int, ...], list[int]], wrong: bool = False) -> None:
        self.refs = refs
        self.wrong = wrong

    def propose(self, seqs: Sequence[DraftInput]) -> list[tuple[int, ...]]:
        out: list[tuple[int, ...]] = []
        for s in seqs:
            ref = self.refs.get(tuple(s.prompt_ids))
            seen = [*s.output_ids, *s.prefix]
            n = len(seen)
            if ref is None or seen != ref[:n]:
                out.append(())
            else:
                out.append(tuple(t ^ 1 if self.wrong else t for t in ref[n:n + s.max_tokens]))
        return out

    def release(self, seq_id: int) -> None:
        pass


class _StepCounter(EngineObserver):
    def __init__(self) -> None:
        self.seq_steps = 0  # decode rows summed over steps (a verify chunk is one row)

    def on_step(self, seconds: float, num_decode_rows: int, num_prefill_tokens: int) -> None:
        self.seq_steps += num_decode_rows


def step_budget(prompts: list[list[int]]) -> int:
    """A step budget that prefills every prompt of a pass in one step."""
    return max(512, sum(map(len, prompts)))


def load(cfg: SpecBenchConfig, max_prompt: int) -> tuple[Any, Any]:
    """(runner with KV for max(concurrency) sequences of max_prompt + gen_len, tokenizer)."""
    from engine.config import EngineConfig
    from engine.hardware_probe import probe_hardware
    from engine.kernels.registry import KernelOverrides
    from engine.loader import load_weights
    from engine.runner import ModelRunner
    from engine.text.tokenizer import Tokenizer

    weights = load_weights(cfg.model_dir, progress=False)
    seqs = max(cfg.concurrency)
    need = max_prompt + cfg.gen_len + 32
    per_token = weights.config.kv_bytes_per_token()
    ecfg = EngineConfig(model_dir=cfg.model_dir, max_num_seqs=seqs, max_model_len=need,
                        threads=cfg.threads,
                        max_num_batched_tokens=max(512, seqs * max_prompt),
                        kv_cache_gib=max(per_token * seqs * (need + 32) * 1.1 / 2**30, 1e-3))
    runner = ModelRunner(weights, ecfg, probe_hardware(), KernelOverrides.from_env())
    return runner, Tokenizer.from_dir(cfg.model_dir)


def run_pass(runner: Any, tokenizer: Any, cfg: SpecBenchConfig, spec: SpeculativeConfig | None,
             prompts: list[list[int]], proposer: Proposer | None = None,
             predictions: list[list[int]] | None = None) -> dict[str, Any]:
    """One pass: C requests to completion; the decode phase timed. ``proposer`` replaces
    the engine's drafts' source (with ``spec``); ``predictions``: each request's predicted
    output."""
    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.sampling_params import SamplingParams

    c = len(prompts)
    ecfg = EngineConfig(model_dir=cfg.model_dir, max_num_seqs=c,
                        max_model_len=runner.engine_config.max_model_len,
                        max_num_batched_tokens=step_budget(prompts),
                        enable_prefix_caching=False, speculative_config=spec)
    steps = _StepCounter()
    eng = Engine(runner, tokenizer, ecfg, observer=steps)
    if proposer is not None and spec is not None:
        eng.spec.proposer = proposer
    outs: list[list[int]] = [[] for _ in prompts]
    done = [False] * c
    for i, p in enumerate(prompts):
        def sink(o, i=i):
            outs[i].extend(o.token_ids)
            done[i] = done[i] or o.finished
        eng.add_request(f"r{i}", p, SamplingParams(max_tokens=cfg.gen_len, temperature=0.0),
                        sink, prediction=tuple(predictions[i]) if predictions else ())
    while not all(outs[i] or done[i] for i in range(c)):
        eng.step()
    first = sum(map(len, outs))
    if first != c:  # some request decoded before another's prefill: unequal windows
        raise RuntimeError(f"prefill of {c} requests took more than one step ({first} tokens)")
    seq_steps0 = steps.seq_steps
    t0 = time.perf_counter()
    while not all(done):
        eng.step()
    dt = time.perf_counter() - t0
    made = sum(map(len, outs)) - first
    res: dict[str, Any] = {"decode_tok_s": made / dt if dt > 0 else None, "decode_s": dt,
                           "decode_tokens": made,
                           "tokens_per_seq_step": made / max(1, steps.seq_steps - seq_steps0),
                           "outputs": outs}
    if spec is not None or predictions:
        s = eng.spec.stats
        k = max(spec.num_speculative_tokens if spec else 0,
                PREDICTION_DRAFT_TOKENS if predictions else 0)
        res["spec"] = {"num_drafts": s.num_drafts, "num_draft_tokens": s.num_draft_tokens,
                       "num_accepted_tokens": s.num_accepted_tokens,
                       "acceptance_rate": s.acceptance_rate,
                       "mean_accepted_length": s.mean_accepted_length,
                       "accepted_per_pos": s.accepted_per_pos[:k],
                       "num_prediction_tokens": s.num_prediction_tokens,
                       "num_accepted_prediction_tokens": s.num_accepted_prediction_tokens}
    return res


def _median(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x]
    return statistics.median(xs) if xs else None


def run_spec_bench(cfg: SpecBenchConfig, log: Log = print) -> dict[str, Any]:
    import torch

    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    from engine.text.tokenizer import Tokenizer

    tok = Tokenizer.from_dir(cfg.model_dir)
    prompts = {(w, c): [tok.encode_chat(workload_messages(w, i)) for i in range(c)]
               for w in cfg.workloads for c in cfg.concurrency}
    log(f"loading {cfg.model_dir}")
    runner, tokenizer = load(cfg, max(len(p) for ps in prompts.values() for p in ps))
    texts = {w: tok.encode(PREDICTIONS[w], add_special_tokens=False)
             for w in cfg.workloads if cfg.prediction == "text"}
    rows = []
    for w in cfg.workloads:
        for c in cfg.concurrency:
            passes: dict[str, list[dict[str, Any]]] = {"off": [], "on": []}
            for r in range(cfg.rounds):
                for mode in ("off", "on"):  # interleaved: drift hits both alike
                    replay = None
                    if mode == "on" and cfg.oracle:
                        off = passes["off"][-1]["outputs"]
                        replay = ReplayProposer({tuple(p): o
                                                 for p, o in zip(prompts[(w, c)], off,
                                                                 strict=True)},
                                                wrong=cfg.oracle == "wrong")
                    predicted = None
                    if mode == "on" and cfg.prediction is not None:
                        predicted = ([texts[w]] * c if cfg.prediction == "text"
                                     else passes["off"][-1]["outputs"])
                    res = run_pass(runner, tokenizer, cfg, cfg.spec if mode == "on" else None,
                                   prompts[(w, c)], replay, predicted)
                    passes[mode].append(res)
                    log(f"{w} c={c} round {r + 1} {mode}: "
                        f"{res['decode_tok_s'] or 0:.1f} decode tok/s, "
                        f"{res['tokens_per_seq_step']:.2f} tokens/seq-step")
            rows.append(_row(w, c, passes))
    return {"schema": 1, "config": {k: (str(v) if isinstance(v, Path) else v)
                                    for k, v in asdict(cfg).items()} | {
                                        "spec": json_spec(cfg.spec)},
            "threads": torch.get_num_threads(), "rows": rows}


def json_spec(spec: SpeculativeConfig | None) -> dict[str, Any] | None:
    import json

    return None if spec is None else json.loads(spec.to_json())


def _row(w: str, c: int, passes: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    off = _median([p["decode_tok_s"] for p in passes["off"]])
    on = _median([p["decode_tok_s"] for p in passes["on"]])
    same = all(p["outputs"] == passes["off"][0]["outputs"]
               for p in passes["off"] + passes["on"])
    last = passes["on"][-1]
    return {"workload": w, "concurrency": c, "plain_decode_tok_s": off,
            "spec_decode_tok_s": on, "speedup": on / off if on and off else None,
            "outputs_identical": same,
            "decode_tokens": last["decode_tokens"],
            "tokens_per_seq_step": last["tokens_per_seq_step"], "spec": last.get("spec"),
            "passes": {m: [{k: v for k, v in p.items() if k != "outputs"} for p in ps]
                       for m, ps in passes.items()}}


def format_table(res: dict[str, Any]) -> str:
    cfg = res["config"]
    oracle = (f", drafts from the plain pass's output, all {cfg['oracle']} "
              f"(--spec-oracle)" if cfg.get("oracle") else "")
    what = [f"speculative decoding {cfg['spec']}"] if cfg["spec"] else []
    if cfg.get("prediction"):
        what.append(f"predicted outputs ({cfg['prediction']}: " + (
            "the text the prompt quotes or edits)" if cfg["prediction"] == "text"
            else "the plain pass's output)"))
    lines = [f"{' + '.join(what)}{oracle}, {res['threads']} threads, "
             f"gen_len {res['config']['gen_len']}, median of {res['config']['rounds']} "
             f"interleaved rounds",
             f"{'workload':<11}{'C':>4}{'plain tok/s':>13}{'spec tok/s':>12}{'x':>7}"
             f"{'tok/seq-step':>14}{'accept':>8}{'identical':>11}"]
    for r in res["rows"]:
        s = r["spec"] or {}
        lines.append(f"{r['workload']:<11}{r['concurrency']:>4}"
                     f"{r['plain_decode_tok_s'] or 0:>13.1f}{r['spec_decode_tok_s'] or 0:>12.1f}"
                     f"{r['speedup'] or 0:>7.2f}{r['tokens_per_seq_step']:>14.2f}"
                     f"{s.get('acceptance_rate', 0):>8.2f}{str(r['outputs_identical']):>11}")
    lines.append("(x: speculation's decode tokens/s over plain; tok/seq-step: tokens each "
                 "sequence gained per engine step it ran in; accept: accepted / drafted)")
    return "\n".join(lines)
