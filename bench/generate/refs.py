"""The same-run references of `fp8serve bench generate` (bench/generate/run.py):
the bytes one decode step must read (the bandwidth bound's denominator) and torch bf16
matmul over the model's own linear shapes (the prefill compute reference)."""

from __future__ import annotations

from functools import partial
from typing import Any

import torch

from bench.common.timing import time_calls
from engine.config import ModelConfig
from engine.kernels.base import Fp8Weight
from engine.weights import LINEAR_NAMES, ModelWeights

BYTES_FORMULA = ("bytes/token = sum over decoder linears of weight bytes (FP8: N*K + scales; "
                 "bf16: 2*N*K) + lm_head bytes (V*H*2 bf16, or V*H + V*4 FP8) + one embedding "
                 "row (H*2) + RMSNorm weights ((2*L+1)*H*2); KV-cache reads are not counted")

def _linear_bytes(w: Fp8Weight | torch.Tensor) -> int:
    if isinstance(w, Fp8Weight):
        return w.weight.numel() + w.scale.numel() * w.scale.element_size()
    return w.numel() * w.element_size()


def head_bytes(weights: ModelWeights, lm_head_dtype: str = "auto") -> int:
    """The lm_head's bytes as the model runs it (engine/model/lm_head.py): bf16 V*H*2;
    FP8 V*H + its scales (a quantized bf16 head: per-channel fp32, V*4)."""
    head = weights.embed_tokens if weights.lm_head is None else weights.lm_head
    v, h = weights.config.vocab_size, weights.config.hidden_size
    if lm_head_dtype == "fp8" and not isinstance(head, Fp8Weight):
        return v * h + 4 * v
    if lm_head_dtype == "bf16" and isinstance(head, Fp8Weight):
        return v * h * 2
    return _linear_bytes(head)


def decode_bytes_per_token(weights: ModelWeights, lm_head_dtype: str = "auto") -> dict[str, Any]:
    """What one decode step must read from memory at least (see BYTES_FORMULA)."""
    cfg = weights.config
    fp8 = bf16 = 0
    for layer in weights.layers:
        for name in LINEAR_NAMES:
            w = getattr(layer, name)
            if isinstance(w, Fp8Weight):
                fp8 += _linear_bytes(w)
            else:
                bf16 += _linear_bytes(w)
    parts = {"fp8_linear_bytes": fp8, "bf16_linear_bytes": bf16,
             "lm_head_bytes": head_bytes(weights, lm_head_dtype),
             "embedding_row_bytes": cfg.hidden_size * weights.embed_tokens.element_size(),
             "norm_bytes": (2 * cfg.num_layers + 1) * cfg.hidden_size * 2}
    return parts | {"total": sum(parts.values()), "formula": BYTES_FORMULA}


def prefill_linear_shapes(cfg: ModelConfig) -> list[tuple[str, int, int]]:
    """(name, N, K) of one decoder layer's linears as the engine runs them (q/k/v and
    gate/up fused): the same FLOPs as the seven unfused projections."""
    h = cfg.hidden_size
    return [("qkv_proj", cfg.q_size + 2 * cfg.kv_size, h), ("o_proj", h, cfg.q_size),
            ("gate_up_proj", 2 * cfg.intermediate_size, h), ("down_proj", h, cfg.intermediate_size)]


def bf16_prefill_reference(cfg: ModelConfig, m: int, reps: int) -> dict[str, Any]:
    """Torch bf16 matmul, x [m, K] @ w.T (w [N, K]), for every decoder linear at M = m, plus
    the lm_head at M = 1 (prefill computes one logit row): the time torch needs for the
    linear FLOPs of a prefill of ``m`` tokens, as an equivalent tokens/s."""
    gen = torch.Generator().manual_seed(0)
    per_shape: list[dict[str, Any]] = []
    layer_s, flops = 0.0, 0
    for name, n, k in prefill_linear_shapes(cfg):
        w = (torch.randn(n, k, generator=gen) * 0.02).to(torch.bfloat16)
        x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
        s = time_calls([partial(torch.matmul, x, w.t())], reps=reps, warmup=1)
        per_shape.append({"name": name, "n": n, "k": k, "m": m, "s": s,
                          "tflops": 2 * m * n * k / s / 1e12})
        layer_s += s
        flops += 2 * m * n * k
        del w, x
    head_w = (torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen) * 0.02).bfloat16()
    hx = torch.randn(1, cfg.hidden_size, generator=gen).bfloat16()
    head_s = time_calls([partial(torch.matmul, hx, head_w.t())], reps=reps, warmup=1)
    total_s = cfg.num_layers * layer_s + head_s
    total_flops = cfg.num_layers * flops + 2 * cfg.vocab_size * cfg.hidden_size
    return {"m": m, "shapes": per_shape, "lm_head_s": head_s, "total_s": total_s,
            "total_flops": total_flops, "tflops": total_flops / total_s,
            "prefill_tok_s": m / total_s}
