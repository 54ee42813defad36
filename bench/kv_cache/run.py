"""`fp8serve bench kv-cache`: the FP8 (e4m3) KV cache against the bf16 one, over one loaded
model in one process (one runner; its KV store swapped between the two dtypes, both on the
same path: the fused decode ops where the host runs them, else the per-layer one).

* accuracy (``greedy_tokens`` > 0): per prompt, each cache decodes greedily on its own;
  leading tokens in agreement and equal positions. Then prompt + the bf16 continuation is
  prefilled on each cache and the next-token distributions compared at every position:
  KL(bf16 || fp8) mean / max and top-1 agreement.
* speed (``contexts``): decode tok/s at each context length, the cache pre-filled with the
  same random K/V for both dtypes (attention costs the same whatever the values, and no
  prefill of thousands of tokens is needed), in interleaved rounds (bf16, fp8, then fp8,
  bf16, ...); ratios fp8 / bf16 within each round.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from engine.batch import BatchInputs, LogitsWanted, SeqChunk
from engine.model.kv_store import KV_DTYPE, KV_FP8, KVStore, quantize_kv, write_fp8_rows

PROMPT_IDS_SEED = 0


@dataclass(frozen=True)
class KvCacheBenchConfig:
    model_dir: Path
    contexts: tuple[int, ...] = (512,)
    speed_rounds: int = 3
    speed_tokens: int = 8
    greedy_tokens: int = 0
    num_prompts: int = 4
    threads: int | None = None

    def __post_init__(self) -> None:
        if min(self.speed_rounds, self.speed_tokens, self.num_prompts) < 1 or \
                self.greedy_tokens < 0 or any(c < 1 for c in self.contexts):
            raise ValueError("rounds, tokens, prompts and contexts must be >= 1")


def load_runner(cfg: KvCacheBenchConfig, max_len: int):
    from engine.config import EngineConfig
    from engine.hardware_probe import probe_hardware
    from engine.kernels.registry import KernelOverrides
    from engine.loader import load_weights
    from engine.runner import ModelRunner

    weights = load_weights(cfg.model_dir, progress=False)
    per_token = weights.config.kv_bytes_per_token()
    ecfg = EngineConfig(model_dir=cfg.model_dir, max_num_seqs=1, max_model_len=max_len,
                        threads=cfg.threads, max_num_batched_tokens=512,
                        kv_cache_gib=per_token * (max_len + 64) * 1.1 / 2**30)
    return ModelRunner(weights, ecfg, probe_hardware(), KernelOverrides.from_env())


def stores(runner) -> dict[str, KVStore]:
    """The runner's bf16 store and an fp8 one of the same blocks (per-row scales)."""
    c, kv = runner.config, runner.kv
    fp8 = KVStore.allocate(c, kv.num_blocks, kv.block_size, KV_FP8)
    return {"bf16": kv, "fp8": fp8}


def fill_random(st: dict[str, KVStore], tokens: int, seed: int = 0) -> None:
    """Slots [0, tokens) of every layer: the same N(0, 1) K/V (bf16), fp8 quantized."""
    g = torch.Generator().manual_seed(seed)
    bf, f8 = st["bf16"], st["fp8"]
    slots = torch.arange(tokens, dtype=torch.int64)
    for i in range(bf.kv.shape[0]):
        b, f = bf.layer(i), f8.layer(i)
        shape = (tokens, b.k.shape[1], b.k.shape[3])  # [T, Hkv, D]
        k, v = (torch.randn(shape, generator=g).to(KV_DTYPE) for _ in range(2))
        b.scatter(slots, k, v)
        write_fp8_rows(f, k, v, slots)


def decode_tok_s(runner, store: KVStore, context: int, n: int) -> float:
    runner.kv = store
    blocks = tuple(range(-(-(context + n) // runner.block_size)))
    t0 = time.perf_counter()
    for i in range(n):
        runner.run(BatchInputs((SeqChunk(0, (1 + i,), context + i, blocks,
                                         prompt_len=context),)))
    return n / (time.perf_counter() - t0)


def speed(runner, st: dict[str, KVStore], cfg: KvCacheBenchConfig, log) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for ctx in cfg.contexts:
        fill_random(st, ctx)
        decode_tok_s(runner, st["bf16"], ctx, 2)  # warm-up
        decode_tok_s(runner, st["fp8"], ctx, 2)
        rounds: dict[str, list[float]] = {"bf16": [], "fp8": []}
        for r in range(cfg.speed_rounds):
            for name in (("bf16", "fp8") if r % 2 == 0 else ("fp8", "bf16")):
                rounds[name].append(decode_tok_s(runner, st[name], ctx, cfg.speed_tokens))
            log(f"context {ctx} round {r}: bf16 {rounds['bf16'][-1]:.2f} tok/s, "
                f"fp8 {rounds['fp8'][-1]:.2f} tok/s")
        ratios = [f / b for f, b in zip(rounds["fp8"], rounds["bf16"], strict=True)]
        out[str(ctx)] = {"decode_tok_s": rounds, "ratio_per_round": ratios,
                         "ratio_median": statistics.median(ratios),
                         "ratio_best": max(rounds["fp8"]) / max(rounds["bf16"])}
    return out


def greedy(runner, store: KVStore, prompt: list[int], n: int) -> list[int]:
    from engine.runner import generate_greedy

    runner.kv = store
    return generate_greedy(runner, prompt, n)


def logits_all(runner, store: KVStore, ids: list[int]) -> torch.Tensor:
    runner.kv = store
    blocks = tuple(range(-(-len(ids) // runner.block_size)))
    rows = []
    for a in range(0, len(ids), 512):
        chunk = SeqChunk(0, tuple(ids[a:a + 512]), a, blocks, LogitsWanted.ALL)
        rows.append(runner.run(BatchInputs((chunk,))))
    return torch.cat(rows)


def accuracy(runner, st: dict[str, KVStore], prompts: list[list[int]],
             n: int) -> dict[str, Any]:
    per, kls, top1 = [], [], []
    for p in prompts:
        a, b = greedy(runner, st["bf16"], p, n), greedy(runner, st["fp8"], p, n)
        lead = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), n)
        per.append({"leading_agree": lead, "equal": sum(x == y for x, y in zip(a, b, strict=True))})
        ref, got = logits_all(runner, st["bf16"], p + a), logits_all(runner, st["fp8"], p + a)
        lp, lq = ref.log_softmax(-1), got.log_softmax(-1)
        kls.append((lp.exp() * (lp - lq)).sum(-1))
        top1.append((ref.argmax(-1) == got.argmax(-1)).float())
    kl, t1 = torch.cat(kls), torch.cat(top1)
    scales = scale_granularity(st["bf16"], len(prompts[-1]) + n)  # the last prefill's K/V
    return {"greedy": per, "greedy_leading_mean": statistics.mean(g["leading_agree"] for g in per),
            "greedy_all_equal": sum(g["equal"] == n for g in per),
            "kl_mean": float(kl.mean()), "kl_p99": float(torch.quantile(kl.double(), 0.99)),
            "kl_max": float(kl.max()), "top1": float(t1.mean()),
            "rows": int(kl.numel()), "scale_granularity_rel_rms": scales}


def scale_granularity(store: KVStore, tokens: int) -> dict[str, float]:
    """Relative RMS error of the first ``tokens`` rows of every layer's real K and V
    (a bf16 store after a prefill) quantized to e4m3 with one scale per (token, KV head)
    (what the cache does) or per (block, KV head) (the alternative)."""
    err: dict[str, list[float]] = {"k_token": [], "k_block": [], "v_token": [], "v_block": []}
    bs = store.block_size
    n = tokens // bs * bs
    slots = torch.arange(n, dtype=torch.int64)
    for i in range(store.kv.shape[0]):
        for name, x in zip("kv", store.layer(i).gather(slots), strict=True):
            xf = x.float()  # [n, Hkv, D]
            q, s = quantize_kv(x)
            err[f"{name}_token"].append(_rel_rms(q.float() * s[..., None], xf))
            blk = xf.view(n // bs, bs, *xf.shape[1:])
            sb = (blk.abs().amax(dim=(1, 3), keepdim=True) / 448).clamp_min(1e-30)
            qb = (blk / sb).clamp(-448, 448).to(KV_FP8).float() * sb
            err[f"{name}_block"].append(_rel_rms(qb.view_as(xf), xf))
    return {k: statistics.mean(v) for k, v in err.items()}


def _rel_rms(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm())


def bench_prompts(cfg: KvCacheBenchConfig, vocab: int) -> list[list[int]]:
    from bench.lm_head.run import PROMPTS
    try:
        from engine.text.tokenizer import Tokenizer
        tok = Tokenizer.from_dir(cfg.model_dir)
        return [tok.encode_chat([{"role": "user", "content": t}]) for t in
                PROMPTS[:cfg.num_prompts]]
    except Exception:  # a checkpoint without a usable tokenizer: random ids
        g = torch.Generator().manual_seed(PROMPT_IDS_SEED)
        return [torch.randint(3, vocab, (32,), generator=g).tolist()
                for _ in range(cfg.num_prompts)]


def run_kv_cache_bench(cfg: KvCacheBenchConfig, log=print) -> dict[str, Any]:
    max_len = max([*cfg.contexts, 0]) + cfg.speed_tokens + 16
    max_len = max(max_len, 512 + cfg.greedy_tokens + 64)
    runner = load_runner(cfg, max_len)
    st = stores(runner)
    res: dict[str, Any] = {"config": {k: str(v) if isinstance(v, Path) else v
                                      for k, v in asdict(cfg).items()},
                           "threads": torch.get_num_threads(),
                           "kv_bytes_per_block": {n: s.bytes_per_block for n, s in st.items()}}
    if cfg.greedy_tokens:
        prompts = bench_prompts(cfg, runner.config.vocab_size)
        res["accuracy"] = accuracy(runner, st, prompts, cfg.greedy_tokens)
        log(f"accuracy: {res['accuracy']}")
    res["speed"] = speed(runner, st, cfg, log)
    runner.kv = st["bf16"]
    return res



def _op_calls(c: Any, keys: int, bs: int = 16,
              layers: int = 1) -> tuple[dict[str, list[Any]], dict[str, int]]:
    """({dtype: ``layers`` paged_attention calls over ``keys`` random keys, each on its own
    copy of the K/V}, {dtype: K/V bytes of one call})."""
    from functools import partial

    ops, g = torch.ops.fp8serve, torch.Generator().manual_seed(0)
    rows = (keys, c.num_kv_heads, c.head_dim)  # [T, Hkv, D] as written
    shape = (keys // bs, c.num_kv_heads, bs, c.head_dim)  # the cache layout (kv_store.py)
    k_rows, v_rows = (torch.randn(*rows, generator=g).to(KV_DTYPE) for _ in range(2))
    k, v = (torch.zeros(shape, dtype=KV_DTYPE) for _ in range(2))
    ops.kv_write(k, v, k_rows, v_rows, torch.arange(keys))
    k8, v8 = (torch.zeros(shape, dtype=KV_FP8) for _ in range(2))
    ks, vs = torch.ones(shape[:3]), torch.ones(shape[:3])
    ops.kv_write_fp8(k8, v8, ks, vs, k_rows, v_rows, torch.arange(keys), 0.0, 0.0)
    q = torch.randn(1, c.num_heads, c.head_dim, generator=g).to(KV_DTYPE)
    meta = (torch.arange(keys // bs, dtype=torch.int32)[None],
            torch.zeros(1, dtype=torch.int32), torch.tensor([keys], dtype=torch.int32), bs,
            c.head_dim ** -0.5)
    calls: dict[str, list[Any]] = {"bf16": [], "fp8": []}
    for i in range(layers):  # layer 0 uses the originals, the others copies
        cp = (lambda x: x) if i == 0 else torch.clone
        calls["bf16"].append(partial(ops.paged_attention, q, cp(k), cp(v), *meta))
        calls["fp8"].append(partial(ops.paged_attention, q, cp(k8), cp(v8), *meta, cp(ks),
                                    cp(vs)))
    return calls, {"bf16": 2 * k.numel() * 2, "fp8": 2 * (k8.numel() + ks.numel() * 4)}


def attention_op_speed(model_dir: Path, contexts: tuple[int, ...], rounds: int,
                       threads: int | None = None, layers: int = 1) -> dict[str, Any]:
    """The paged-attention op alone at the model's head shape: one decode row over each
    context's keys (rounded up to a block) of random K/V, bf16 vs fp8 (kv_write_fp8's
    bytes and per-row scales), ``rounds`` reps each after a warm-up, interleaved (bf16
    first in even reps). A rep calls ``layers`` copies of the K/V in turn, as a model's
    layers do (with enough of them the KV no longer stays in the last-level cache between
    calls). Per context: seconds per call, K/V bytes read, fp8 / bf16 per rep."""
    import ext
    from engine.loader import read_model_config

    if not ext.load().built:
        raise RuntimeError(f"the extension is not built: {ext.load().error}")
    if threads is not None:
        torch.set_num_threads(threads)
    c = read_model_config(model_dir)
    out: dict[str, Any] = {"heads": c.num_heads, "kv_heads": c.num_kv_heads,
                           "head_dim": c.head_dim, "threads": torch.get_num_threads(),
                           "layers": layers, "isa": ext.isa()}
    for ctx in contexts:
        keys = -(-ctx // 16) * 16
        calls, nbytes = _op_calls(c, keys, layers=layers)
        t: dict[str, list[float]] = {"bf16": [], "fp8": []}
        for r in range(rounds + 1):  # rep 0 warms up
            for name in (("bf16", "fp8") if r % 2 == 0 else ("fp8", "bf16")):
                t0 = time.perf_counter()
                for call in calls[name]:
                    call()
                if r:
                    t[name].append((time.perf_counter() - t0) / layers)
        out[str(keys)] = {"seconds": t, "kv_bytes": nbytes, "ratio_per_rep":
                          [f / b for f, b in zip(t["fp8"], t["bf16"], strict=True)]}
    return out
