"""`fp8serve bench lm-head`: what an FP8 lm_head costs in accuracy and gains in speed,
against the bf16 head, both built over the same loaded decoder in one process.

    bf16 head  the model built with lm_head_dtype="bf16" (the runner's own head)
    fp8 head   the same table quantized per output channel (engine/model/lm_head.py) on
               the registry's FP8 kernel (named in the result)

Measured, per prompt (real texts through the tokenizer's chat template; random ids with
--random-prompts or a checkpoint without a tokenizer):

* logits: hidden states of every position of prompt + the bf16 head's greedy
  continuation (one prefill through the real decoder) go through both heads: KL(bf16 ||
  fp8) mean / p99 / max over all rows, and top-1 agreement;
* greedy: each head decodes ``greedy_tokens`` on its own; leading tokens in agreement
  and the fraction of equal positions;
* speed: decode tok/s of each head, interleaved rounds (bf16, fp8, then fp8, bf16, ...),
  and the head alone at M = 1, interleaved; ratios fp8 / bf16 within each round.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from bench.common.timing import time_calls
from bench.generate.run import bench_prompt
from bench.lm_head.logit_compare import Head, agreement, compare_heads

PROMPTS = (
    "Explain in a few sentences why the sky is blue.",
    "Write a Python function that returns the n-th Fibonacci number.",
    "What is the capital of Australia, and why is it not Sydney?",
    "Tell me a short story about a lighthouse keeper and a storm.",
    "List three differences between TCP and UDP.",
    "If I have 3 apples and buy 5 more, then eat 2, how many do I have? Explain.",
)


@dataclass(frozen=True)
class LmHeadBenchConfig:
    model_dir: Path
    kl_tokens: int = 64  # bf16 greedy tokens appended to each prompt for the logit rows
    greedy_tokens: int = 256
    num_prompts: int = len(PROMPTS)
    random_prompts: bool = False
    random_prompt_len: int = 32
    speed_rounds: int = 3
    speed_tokens: int = 64
    threads: int | None = None

    def __post_init__(self) -> None:
        if min(self.kl_tokens, self.greedy_tokens, self.speed_tokens, self.num_prompts,
               self.speed_rounds, self.random_prompt_len) < 1:
            raise ValueError("token counts, prompts and rounds must be >= 1")


def _prompts(cfg: LmHeadBenchConfig, vocab: int, bos: int | None) -> list[list[int]]:
    tok = None
    if not cfg.random_prompts:
        from engine.text.tokenizer import Tokenizer

        try:
            tok = Tokenizer.from_dir(cfg.model_dir)
        except Exception:  # noqa: BLE001 - no tokenizer: random ids instead
            tok = None
    if tok is None:
        return [bench_prompt(vocab, cfg.random_prompt_len, seed, bos)
                for seed in range(cfg.num_prompts)]
    texts = [PROMPTS[i % len(PROMPTS)] for i in range(cfg.num_prompts)]
    return [tok.encode_chat([{"role": "user", "content": t}]) for t in texts]


def _build(cfg: LmHeadBenchConfig, longest: int) -> tuple[Any, Head, Any]:
    """(runner with the bf16 head, the fp8 head, the fp8 head's kernel report)."""
    from engine.config import EngineConfig
    from engine.hardware_probe import probe_hardware
    from engine.kernels.layer_kernel import KernelReport
    from engine.kernels.registry import KernelOverrides
    from engine.loader import load_weights
    from engine.model.layers import LinearFactory
    from engine.model.lm_head import head_weight
    from engine.runner import ModelRunner

    weights = load_weights(cfg.model_dir, progress=False)
    need = longest + 16
    per_token = weights.config.kv_bytes_per_token()
    ecfg = EngineConfig(model_dir=cfg.model_dir, max_num_seqs=1, max_model_len=need,
                        threads=cfg.threads, max_num_batched_tokens=max(512, need),
                        kv_cache_gib=max(per_token * (need + 64) * 1.25 / 2**30, 1e-3),
                        lm_head_dtype="bf16")
    hw, overrides, report = probe_hardware(), KernelOverrides.from_env(), KernelReport()
    runner = ModelRunner(weights, ecfg, hw, overrides)
    fp8 = LinearFactory(hw, overrides, report)("lm_head", head_weight(weights, "fp8"))
    return runner, fp8, report


def _step(runner: Any, head: Head, chunk: Any) -> int:
    """The chunk's next token through ``head``; an FP8 head is told the logit row's role,
    as the server does (AMX hosts run a decode row on the generated-rows kernel)."""
    from engine.batch import BatchInputs
    from engine.model.layers import Fp8Linear

    batch = BatchInputs((chunk,))
    h = runner.hidden(batch)
    if isinstance(head, Fp8Linear):
        roles = batch.generated_rows()
        return int(torch.argmax(head(h, None if roles is None else roles[-1:])[0]))
    return int(torch.argmax(head(h)[0]))


def greedy(runner: Any, head: Head, prompt: list[int], n: int) -> tuple[list[int], float]:
    """``n`` greedy tokens through ``head`` (blocks 0..; argmax included), and the
    seconds of the n - 1 decode steps after the prefill."""
    from engine.batch import SeqChunk

    blocks = tuple(range(-(-(len(prompt) + n) // runner.block_size)))
    chunk = SeqChunk(0, tuple(prompt), 0, blocks, prompt_len=len(prompt))
    out = [_step(runner, head, chunk)]
    t0 = time.perf_counter()
    for _ in range(n - 1):
        chunk = SeqChunk(0, (out[-1],), chunk.start_pos + chunk.num_tokens, blocks,
                         prompt_len=len(prompt))
        out.append(_step(runner, head, chunk))
    return out, time.perf_counter() - t0


def hidden_rows(runner: Any, ids: list[int]) -> torch.Tensor:
    """The head's input for every position of ``ids``: [len(ids), H] bf16."""
    from engine.batch import BatchInputs, LogitsWanted, SeqChunk

    blocks = tuple(range(-(-len(ids) // runner.block_size)))
    chunk = SeqChunk(0, tuple(ids), 0, blocks, LogitsWanted.ALL)
    return runner.hidden(BatchInputs((chunk,)))


def _accuracy(runner: Any, heads: dict[str, Head], prompts: list[list[int]],
              cfg: LmHeadBenchConfig) -> dict[str, Any]:
    rows, per_prompt = [], []
    for p in prompts:
        cont, _ = greedy(runner, heads["bf16"], p, cfg.kl_tokens)
        rows.append(hidden_rows(runner, p + cont))
        a, _ = greedy(runner, heads["bf16"], p, cfg.greedy_tokens)
        b, _ = greedy(runner, heads["fp8"], p, cfg.greedy_tokens)
        lead, frac = agreement(a, b)
        per_prompt.append({"prompt_tokens": len(p), "leading_agree": lead,
                           "positions_equal": frac})
    logits = compare_heads(heads["bf16"], heads["fp8"], torch.cat(rows))
    return {"logits": logits, "greedy": per_prompt,
            "greedy_leading_mean": statistics.mean(g["leading_agree"] for g in per_prompt),
            "greedy_all_equal": sum(g["leading_agree"] == cfg.greedy_tokens
                                    for g in per_prompt)}


def _speed(runner: Any, heads: dict[str, Head], prompt: list[int],
           cfg: LmHeadBenchConfig) -> dict[str, Any]:
    """Interleaved: each round runs both heads (order alternating by round)."""
    h1 = hidden_rows(runner, prompt)[-1:].contiguous()
    for head in heads.values():  # warm-up: first calls verify kernels, fault buffers
        greedy(runner, head, prompt, 4)
    decode: dict[str, list[float]] = {k: [] for k in heads}
    head_ms: dict[str, list[float]] = {k: [] for k in heads}
    for r in range(cfg.speed_rounds):
        for name in (("bf16", "fp8") if r % 2 == 0 else ("fp8", "bf16")):
            _, s = greedy(runner, heads[name], prompt, cfg.speed_tokens)
            decode[name].append((cfg.speed_tokens - 1) / s)
            head_ms[name].append(1e3 * time_calls([partial(heads[name], h1)], reps=20))
    ratio = [f / b for f, b in zip(decode["fp8"], decode["bf16"], strict=True)]
    head_ratio = [b / f for f, b in zip(head_ms["fp8"], head_ms["bf16"], strict=True)]
    return {"decode_tok_s": decode, "head_ms": head_ms,
            "decode_ratio_fp8_over_bf16": ratio,
            "decode_ratio_median": statistics.median(ratio),
            # best round of each head: on a contended host the least disturbed figures
            "decode_ratio_best": max(decode["fp8"]) / max(decode["bf16"]),
            "head_speedup_per_round": head_ratio,
            "head_speedup_median": statistics.median(head_ratio)}


@torch.inference_mode()
def run_lm_head_bench(cfg: LmHeadBenchConfig, log=print) -> dict[str, Any]:
    """Everything in one process: load once, accuracy, then interleaved speed."""
    from engine.loader import read_model_config

    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    mcfg = read_model_config(cfg.model_dir)
    prompts = _prompts(cfg, mcfg.vocab_size, mcfg.bos_token_id)
    longest = max(len(p) for p in prompts) + max(cfg.kl_tokens, cfg.greedy_tokens,
                                                  cfg.speed_tokens)
    log(f"loading {cfg.model_dir.name}")
    runner, fp8, report = _build(cfg, longest)
    heads: dict[str, Head] = {"bf16": runner.model.lm_head, "fp8": fp8}
    kernel = report.choices["lm_head"].kernel_id
    log(f"fp8 head on {kernel}; accuracy over {len(prompts)} prompts")
    acc = _accuracy(runner, heads, prompts, cfg)
    log(f"speed: {cfg.speed_rounds} interleaved rounds")
    speed = _speed(runner, heads, prompts[0], cfg)
    v, h = mcfg.vocab_size, mcfg.hidden_size
    return {"schema": 1, "config": {k: str(x) if isinstance(x, Path) else x
                                    for k, x in asdict(cfg).items()},
            "model": {"name": cfg.model_dir.name, "vocab_size": v, "hidden_size": h,
                      "num_layers": mcfg.num_layers, "tied": mcfg.tie_word_embeddings},
            "threads": torch.get_num_threads(),
            "bf16_head": type(runner.model.lm_head).__name__,
            "fp8_head_kernel": kernel,
            "head_bytes": {"bf16": v * h * 2, "fp8": v * h + 4 * v},
            "accuracy": acc, "speed": speed}
