"""How far one lm_head's logits are from another's on the same hidden states.

    kl_rows(ref [R, V] fp32, other [R, V] fp32) -> [R] fp32: KL(softmax(ref) || softmax(other))
    compare_heads(head_ref, head_other, h [R, H] bf16) -> {kl_mean, kl_p99, kl_max, top1, rows}
    agreement(a, b) -> (leading tokens equal, fraction of positions equal)
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

Head = Callable[[torch.Tensor], torch.Tensor]  # x [R, H] bf16 -> logits [R, V]
ROWS_PER_CHUNK = 64  # logit rows alive at a time (a 131072-vocab row is 512 KiB in fp32)


def kl_rows(ref: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
    """ref, other [R, V] -> [R] fp32: sum_v p_ref * (log p_ref - log p_other), in fp32 (so
    >= 0 up to rounding; a tiny negative value is clamped to 0)."""
    lp = torch.log_softmax(ref.float(), dim=-1)
    lq = torch.log_softmax(other.float(), dim=-1)
    return (lp.exp() * (lp - lq)).sum(dim=-1).clamp_min_(0.0)


def compare_heads(head_ref: Head, head_other: Head, h: torch.Tensor) -> dict[str, Any]:
    """Both heads on the same hidden rows h [R, H] bf16: KL(ref || other) mean / p99 /
    max over the rows, and the fraction of rows whose argmax agrees."""
    kls, same = [], 0
    for r0 in range(0, h.shape[0], ROWS_PER_CHUNK):
        x = h[r0:r0 + ROWS_PER_CHUNK]
        a, b = head_ref(x).float(), head_other(x).float()
        kls.append(kl_rows(a, b))
        same += int((a.argmax(dim=-1) == b.argmax(dim=-1)).sum())
    kl = torch.cat(kls) if kls else torch.zeros(0)
    return summarize(kl, same)


def summarize(kl: torch.Tensor, same: int) -> dict[str, Any]:
    """[R] KL values and the count of agreeing argmaxes -> the reported figures."""
    rows = int(kl.numel())
    if rows == 0:
        return {"rows": 0, "kl_mean": None, "kl_p99": None, "kl_max": None, "top1": None}
    return {"rows": rows, "kl_mean": float(kl.mean()),
            "kl_p99": float(torch.quantile(kl.double(), 0.99)), "kl_max": float(kl.max()),
            "top1": same / rows}


def agreement(a: Sequence[int], b: Sequence[int]) -> tuple[int, float]:
    """(leading tokens on which two greedy runs agree, fraction of positions equal)."""
    lead = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        lead += 1
    n = max(len(a), len(b), 1)
    return lead, sum(x == y for x, y in zip(a, b, strict=False)) / n
