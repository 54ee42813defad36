"""Prefill attention alone: the C++ paged-attention op (ext/csrc/attention*.cpp) on one
prompt of N tokens attending causally to its own keys, against torch's
scaled_dot_product_attention (is_causal, GQA) on the same bf16 Q/K/V, at a model's head
shape. Both run in one process on the same threads, in interleaved rounds (ours first in
even rounds); each round's sdpa / ours time ratio is reported (> 1: ours faster), with the
attention FLOP rate (4 * sum of keys attended * Hq * D per call) of each. The two do not
give the same bits (SDPA's blocking follows the shape), so the outputs are compared within
a bf16 tolerance only, as a check that both computed the same attention."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

BLOCK = 16


@dataclass(frozen=True)
class AttentionBenchConfig:
    heads: int
    kv_heads: int
    head_dim: int
    lengths: tuple[int, ...] = (512, 2048)
    rounds: int = 3
    threads: int | None = None

    def __post_init__(self) -> None:
        if min(self.heads, self.kv_heads, self.head_dim, self.rounds) < 1 or \
                self.heads % self.kv_heads or any(n < 1 for n in self.lengths):
            raise ValueError("heads, kv_heads, head_dim, rounds and lengths must be >= 1, "
                             "heads a multiple of kv_heads")


def _inputs(cfg: AttentionBenchConfig, n: int) -> dict[str, Any]:
    """One sequence of ``n`` tokens: q [n, Hq, D] bf16, its K/V in the paged cache
    [blocks, Hkv, 16, D] (block table 0..blocks-1) and as SDPA's [1, H, n, D] views."""
    g = torch.Generator().manual_seed(n)
    blocks = -(-n // BLOCK)
    d, hkv = cfg.head_dim, cfg.kv_heads
    kc, vc = (torch.randn(blocks, hkv, BLOCK, d, generator=g).bfloat16() for _ in range(2))
    q = torch.randn(n, cfg.heads, d, generator=g).bfloat16()
    def seq(c: torch.Tensor) -> torch.Tensor:
        return c.permute(1, 0, 2, 3).reshape(1, hkv, blocks * BLOCK, d)[:, :, :n]

    return {"q": q, "k": kc, "v": vc,
            "tables": torch.arange(blocks, dtype=torch.int32)[None],
            "token_seq": torch.zeros(n, dtype=torch.int32),
            "ctx_lens": torch.arange(1, n + 1, dtype=torch.int32),
            "q4": q.transpose(0, 1).unsqueeze(0), "k4": seq(kc).contiguous(),
            "v4": seq(vc).contiguous()}


def _calls(x: dict[str, Any], scale: float) -> dict[str, Callable[[], torch.Tensor]]:
    ops = torch.ops.fp8serve
    sdpa = torch.nn.functional.scaled_dot_product_attention
    return {
        "ours": lambda: ops.paged_attention(x["q"], x["k"], x["v"], x["tables"],
                                            x["token_seq"], x["ctx_lens"], BLOCK, scale),
        "sdpa": lambda: sdpa(x["q4"], x["k4"], x["v4"], is_causal=True, scale=scale,
                             enable_gqa=True),
    }


def _agreement(out: dict[str, torch.Tensor], n: int, heads: int, d: int) -> float:
    """max |ours - sdpa| / max |sdpa| over the whole output."""
    ours = out["ours"].float().view(n, heads, d)
    ref = out["sdpa"].float()[0].transpose(0, 1)
    return float((ours - ref).abs().max() / ref.abs().max())


def run_attention_bench(cfg: AttentionBenchConfig, log: Callable[[str], None] = print
                        ) -> dict[str, Any]:
    import ext

    if not ext.load().built:
        raise RuntimeError(f"the extension is not built: {ext.load().error}")
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    scale = cfg.head_dim ** -0.5
    res: dict[str, Any] = {"heads": cfg.heads, "kv_heads": cfg.kv_heads,
                           "head_dim": cfg.head_dim, "threads": torch.get_num_threads(),
                           "isa": ext.isa(), "lengths": {}}
    for n in cfg.lengths:
        x = _inputs(cfg, n)
        calls = _calls(x, scale)
        out = {name: call() for name, call in calls.items()}  # warm-up
        err = _agreement(out, n, cfg.heads, cfg.head_dim)
        t: dict[str, list[float]] = {"ours": [], "sdpa": []}
        for r in range(cfg.rounds):
            for name in (("ours", "sdpa") if r % 2 == 0 else ("sdpa", "ours")):
                t0 = time.perf_counter()
                calls[name]()
                t[name].append(time.perf_counter() - t0)
        flops = 4 * (n * (n + 1) / 2) * cfg.heads * cfg.head_dim
        ratios = [s / o for s, o in zip(t["sdpa"], t["ours"], strict=True)]
        res["lengths"][str(n)] = {
            "seconds": t, "sdpa_over_ours": ratios,
            "sdpa_over_ours_median": statistics.median(ratios),
            "gflops_best": {k: flops / min(v) / 1e9 for k, v in t.items()},
            "max_rel_diff": err}
        log(format_length(n, res["lengths"][str(n)]))
    return res


def format_length(n: int, r: dict[str, Any]) -> str:
    g = r["gflops_best"]
    return (f"{n} tokens: ours {min(r['seconds']['ours']) * 1e3:.1f} ms "
            f"({g['ours']:.1f} GFLOP/s), sdpa {min(r['seconds']['sdpa']) * 1e3:.1f} ms "
            f"({g['sdpa']:.1f} GFLOP/s); sdpa / ours time per round "
            + ", ".join(f"{x:.2f}" for x in r["sdpa_over_ours"])
            + f" (> 1: ours faster); outputs differ by {r['max_rel_diff']:.4f} (relative)")


def shape_of(name_or_dir: str) -> tuple[int, int, int]:
    """(Hq, Hkv, D) of a synth-model shape (engine/synth presets: smollm2-135m is the demo
    model's, ministral-3-3b, ministral-3-8b) or of a checkpoint directory's config."""
    from engine.synth.spec import PRESETS

    if name_or_dir in PRESETS:
        p = PRESETS[name_or_dir]
        return p.num_heads, p.num_kv_heads, p.head_dim
    from engine.loader import read_model_config

    c = read_model_config(Path(name_or_dir))
    return c.num_heads, c.num_kv_heads, c.head_dim
