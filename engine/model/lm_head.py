"""The lm_head's weight in the dtype the operator asked for (``--lm-head-dtype``).

    auto  the checkpoint's head as stored: bf16 [V, H] (or the tied embedding), or an
          FP8 head a checkpoint ships (Fp8Weight, any scale kind)
    bf16  a bf16 [V, H] tensor; an FP8 head is dequantized once at load (w8 * scale in
          fp32, rounded to bf16: V*H*2 bytes, one pass, no kernel change)
    fp8   an FP8 head: a bf16 head (tied or not) is quantized at load per output channel
          (see :func:`quantize_per_channel`); an FP8 head is kept as stored

The FP8 head runs through the kernel registry like every decoder linear (its kernel is
in the KernelReport, hence `fp8serve kernels`, GET /kernels and the metrics).

Memory of ``fp8`` on a tied head: the embedding table stays bf16 for F.embedding (V*H*2
bytes, file-mapped; its pages are released after quantizing, so only the rows lookups
touch stay resident) and the head adds its packed FP8 copy: V*H bytes (+ padding to the
kernel's tile) and the scales, V*4 bytes. The unpacked FP8 tensor is never kept: the
kernel re-quantizes from the table if it must pack again (QuantizedHeadSource).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.config import LM_HEAD_DTYPES
from engine.kernels.base import FP8_DTYPE, FP8_MAX, Fp8Weight, ScaleKind
from engine.memory import WeightSource, release_pages
from engine.weights import LinearWeight, ModelWeights

ROWS_PER_CHUNK = 4096  # rows converted at a time: bounds the fp32 temporaries


def check_lm_head_dtype(value: str) -> str:
    """``value`` if it is one of LM_HEAD_DTYPES, else ValueError naming the choices."""
    if value not in LM_HEAD_DTYPES:
        raise ValueError(f"lm_head_dtype {value!r} is not one of {', '.join(LM_HEAD_DTYPES)}")
    return value


def quantize_per_channel(w: torch.Tensor) -> Fp8Weight:
    """w [N, K] bf16 (row-major) -> Fp8Weight: weight [N, K] float8_e4m3fn, scale fp32 [N]
    (ScaleKind.PER_CHANNEL, the dequantization multiplier: W[n] ~= W8[n] * s[n]).

    In fp32: s[n] = amax(|w[n, :]|) / 448 (1.0 for an all-zero row), W8 = rne(w / s)
    clamped to +-448 (the division may land a hair above 448). Row by row, so the result
    is the same whatever the chunking."""
    if w.dim() != 2 or w.dtype != torch.bfloat16:
        raise ValueError(f"quantize_per_channel: w must be [N, K] bf16, got "
                         f"{tuple(w.shape)} {w.dtype}")
    n, k = int(w.shape[0]), int(w.shape[1])
    q = torch.empty(n, k, dtype=FP8_DTYPE)
    s = torch.empty(n, dtype=torch.float32)
    for r0 in range(0, n, ROWS_PER_CHUNK):
        x = w[r0:r0 + ROWS_PER_CHUNK].float()
        amax = x.abs().amax(dim=1)
        sc = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
        s[r0:r0 + ROWS_PER_CHUNK] = sc
        q[r0:r0 + ROWS_PER_CHUNK] = (x / sc[:, None]).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return Fp8Weight(q, s, ScaleKind.PER_CHANNEL)


def _row_scales(w: Fp8Weight, r0: int, r1: int) -> torch.Tensor:
    """fp32 [r1 - r0, K] (or broadcastable) multipliers of rows [r0, r1)."""
    if w.scale_kind is ScaleKind.PER_TENSOR:
        return w.scale.reshape(1, 1)
    if w.scale_kind is ScaleKind.PER_CHANNEL:
        return w.scale[r0:r1, None]
    bn, bk = w.block_size
    rows = w.scale.repeat_interleave(bn, dim=0)[r0:r1]
    return rows.repeat_interleave(bk, dim=1)[:, : w.k]


def dequantize(w: Fp8Weight) -> torch.Tensor:
    """Fp8Weight (any scale kind) -> bf16 [N, K] = rne_bf16(fp32(W8) * scale)."""
    out = torch.empty(w.n, w.k, dtype=torch.bfloat16)
    for r0 in range(0, w.n, ROWS_PER_CHUNK):
        r1 = min(w.n, r0 + ROWS_PER_CHUNK)
        out[r0:r1] = (w.weight[r0:r1].float() * _row_scales(w, r0, r1)).to(torch.bfloat16)
    return out


@dataclass(frozen=True, slots=True)
class QuantizedHeadSource(WeightSource):
    """The FP8 head as a kernel's weight source: ``build()`` quantizes the bf16 table
    [V, H] (a fresh anonymous Fp8Weight the kernel drops once packed), ``release()``
    drops the table's resident mapped pages (the embedding re-reads rows on lookup)."""

    table: torch.Tensor | None = None  # [V, H] bf16

    def __post_init__(self) -> None:
        if self.table is None or self.table.dim() != 2:
            raise ValueError("QuantizedHeadSource needs the [V, H] bf16 table")

    def build(self) -> Fp8Weight:
        assert self.table is not None
        return quantize_per_channel(self.table)

    def release(self) -> int:
        assert self.table is not None
        return release_pages(self.table)


def head_weight(weights: ModelWeights, dtype: str) -> LinearWeight | QuantizedHeadSource:
    """The head to build for ``dtype`` (see the module docstring)."""
    check_lm_head_dtype(dtype)
    head = weights.embed_tokens if weights.lm_head is None else weights.lm_head
    if dtype == "fp8" and isinstance(head, torch.Tensor):
        return QuantizedHeadSource((), table=head.to(torch.bfloat16).contiguous())
    if dtype == "bf16" and isinstance(head, Fp8Weight):
        return dequantize(head)
    return head
