"""The token mask the sampler applies to constrained rows (pure torch, no llguidance).

bits [n, W] int32, W = ceil(vocab_size / 32): bit ``t % 32`` of word ``t // 32`` of row j is
set when token t is allowed for batch row ``rows[j]`` (llguidance's layout, little-endian
words). Columns at or above ``vocab_size`` (the model's padding ids) are never allowed.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

_SHIFTS = torch.arange(8, dtype=torch.uint8)


@dataclass(frozen=True)
class TokenMask:
    rows: tuple[int, ...]  # batch rows the mask applies to, distinct
    bits: torch.Tensor  # [len(rows), ceil(vocab_size / 32)] int32, contiguous
    vocab_size: int  # ids the mask describes; ids >= vocab_size are masked

    def __post_init__(self) -> None:
        n, w = len(self.rows), (self.vocab_size + 31) // 32
        if self.bits.dtype != torch.int32 or tuple(self.bits.shape) != (n, w):
            raise ValueError(f"TokenMask bits: want [{n}, {w}] int32, got "
                             f"{list(self.bits.shape)} {self.bits.dtype}")
        if len(set(self.rows)) != n:
            raise ValueError(f"TokenMask rows repeat: {self.rows}")

    def allowed(self, num_columns: int) -> torch.Tensor:
        """[n, num_columns] bool: True where the token may be sampled."""
        n = len(self.rows)
        flat = ((self.bits.view(torch.uint8)[:, :, None] >> _SHIFTS) & 1).view(n, -1)
        out = torch.zeros(n, num_columns, dtype=torch.bool)
        k = min(num_columns, self.vocab_size)
        out[:, :k] = flat[:, :k].bool()
        return out


def apply_token_mask(x: torch.Tensor, mask: TokenMask) -> None:
    """In place on x [B, V] fp32: disallowed tokens of mask.rows become -inf."""
    if not mask.rows:
        return
    if max(mask.rows) >= x.shape[0]:
        raise ValueError(f"TokenMask rows {mask.rows} outside a batch of {x.shape[0]}")
    idx = torch.as_tensor(mask.rows, dtype=torch.long)
    x[idx] = x[idx].masked_fill(~mask.allowed(x.shape[1]), float("-inf"))
