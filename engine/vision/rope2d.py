"""Pixtral's 2D rotary embedding, half-split layout (q/k rows as HF stores them).

inv_freq = 1 / theta^(arange(0, d, 2) / d) for head_dim d; rows use inv_freq[0::2],
columns inv_freq[1::2]. For the patch at (row r, column c) the d/2 angles are
``cat(r * inv_freq[0::2], c * inv_freq[1::2])``, applied with rotate_half over
``cat(angles, angles)``. Positions index a fixed table of max_patches_per_side
(image_size // patch_size = 110) per axis: a grid larger than that is refused, never
indexed past."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class Rope2D:
    rows: torch.Tensor  # [S, d/4] fp32: r * inv_freq[0::2] for r < S
    cols: torch.Tensor  # [S, d/4] fp32: c * inv_freq[1::2] for c < S

    @classmethod
    def build(cls, head_dim: int, max_side: int, theta: float) -> Rope2D:
        inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
        pos = torch.arange(max_side, dtype=torch.float32)[:, None]
        return cls(rows=pos * inv[0::2], cols=pos * inv[1::2])

    @property
    def max_side(self) -> int:
        return self.rows.shape[0]

    def cos_sin(self, grid_h: int, grid_w: int,
                dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, torch.Tensor]:
        """(cos, sin), each [grid_h * grid_w, 1, d] in ``dtype``, patches row-major."""
        s = self.max_side
        if not (0 < grid_h <= s and 0 < grid_w <= s):
            raise ValueError(f"patch grid {grid_h}x{grid_w} outside the 2D RoPE table "
                             f"({s}x{s} positions)")
        q = self.rows.shape[1]
        ang = torch.cat((self.rows[:grid_h, None, :].expand(grid_h, grid_w, q),
                         self.cols[None, :grid_w, :].expand(grid_h, grid_w, q)), dim=-1)
        ang = torch.cat((ang, ang), dim=-1).reshape(grid_h * grid_w, 1, 4 * q)
        return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope_2d(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, ..., d] (any strides) -> x * cos + rotate_half(x) * sin, a new contiguous
    tensor; rotate_half(x) = cat(-x2, x1); cos, sin broadcast against x ([N, 1, d] for
    [N, heads, d]). Two buffers, the same operations in the same order as the textbook
    form (so the same bits)."""
    half = x.shape[-1] // 2
    rot = torch.cat((x[..., half:], x[..., :half]), dim=-1)
    rot[..., :half].neg_()
    out = x * cos
    out += rot.mul_(sin)
    return out
