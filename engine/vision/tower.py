"""The Pixtral vision tower on CPU: one image at a time (no cross-image attention).

    pixels [3, P*gh, P*gw] fp32 (normalized) --patch_conv (as a GEMM over P x P patches)-->
    [N = gh*gw, D] bf16, patches row-major --ln_pre--> N pre-norm layers:
        q | k | v = qkv(n)                           n = attention_norm(x), one GEMM
        x += o(SDPA(rope(q), rope(k), v))            non-causal, no mask (one image)
        g | u = gate_up(n)                           n = ffn_norm(x), one GEMM
        x += down(act(g) * u)                         act: hidden_act (silu, gelu, ...)
    --> [N, D] (no final norm)

Activations are bf16 or fp32 and GEMMs go through engine/vision/gemm.py (chosen once per
host by measuring). Attention is torch SDPA on [1, heads, N, d] views of the [N, heads, d]
rows (no copies: the CPU flash kernel takes the strides, and its output transposed back
is [N, heads * d] contiguous). The fused GEMMs give the same bits as the separate ones
did (each output element is the same dot product), and RoPE and the residuals compute
the same operations in the same order, only in fewer buffers."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.model.layers import rms_norm
from engine.vision.activation import activation
from engine.vision.config import VisionConfig
from engine.vision.gemm import VisionGemm
from engine.vision.rope2d import Rope2D, apply_rope_2d
from engine.vision.weights import VisionLayerWeights, VisionWeights


def patchify(pixels: torch.Tensor, patch: int,
             dtype: torch.dtype = torch.bfloat16) -> tuple[torch.Tensor, int, int]:
    """pixels [C, H, W] -> ([gh*gw, C*P*P] ``dtype`` rows in conv-weight order (c, y, x),
    gh, gw); H and W must be multiples of P."""
    c, h, w = pixels.shape
    if h % patch or w % patch:
        raise ValueError(f"image {h}x{w} is not a multiple of the patch size {patch}")
    gh, gw = h // patch, w // patch
    rows = pixels.to(dtype).view(c, gh, patch, gw, patch).permute(1, 3, 0, 2, 4)
    return rows.reshape(gh * gw, c * patch * patch), gh, gw


class VisionTower:
    def __init__(self, weights: VisionWeights, gemm: VisionGemm) -> None:
        c: VisionConfig = weights.config
        self.config = c
        self.w = weights
        self.gemm = gemm
        self.conv = weights.patch_conv.reshape(c.hidden_size, -1)  # [D, 3*P*P] view
        self.rope = Rope2D.build(c.head_dim, c.max_patches_per_side, c.rope_theta)
        self.act = activation(c.hidden_act)  # in place

    def flops(self, grid_h: int, grid_w: int) -> float:
        """Multiply-adds x 2 of one image's GEMMs and attention (the benchmark's count)."""
        c, n = self.config, grid_h * grid_w
        d, i = c.hidden_size, c.intermediate_size
        per_layer = 2 * n * (4 * d * d + 3 * d * i) + 4 * n * n * d
        return 2 * n * d * c.num_channels * c.patch_size ** 2 + c.num_layers * per_layer

    @torch.inference_mode()
    def __call__(self, pixels: torch.Tensor) -> tuple[torch.Tensor, int, int]:
        """pixels [3, H, W] fp32 -> (features [gh*gw, D] in gemm.act_dtype, gh, gw)."""
        dt = self.gemm.act_dtype
        patches, gh, gw = patchify(pixels, self.config.patch_size, dt)
        cos, sin = self.rope.cos_sin(gh, gw, dt)
        x = rms_norm(self.gemm.linear(patches, self.conv), self.w.ln_pre, self.config.eps)
        for lw in self.w.layers:
            x = self._layer(x, lw, cos, sin)
        return x, gh, gw

    def _layer(self, x: torch.Tensor, lw: VisionLayerWeights, cos: torch.Tensor,
               sin: torch.Tensor) -> torch.Tensor:
        """x [N, D] -> [N, D], both gemm.act_dtype."""
        c, lin = self.config, self.gemm.linear
        n, heads, d, inter = x.shape[0], c.num_heads, c.head_dim, c.intermediate_size
        qkv = lin(rms_norm(x, lw.attention_norm, c.eps), lw.qkv_proj).view(n, 3, heads, d)
        qk = apply_rope_2d(qkv[:, :2], cos[:, None], sin[:, None])  # [N, 2, heads, d]
        q, k, v = (t.transpose(0, 1)[None] for t in (qk[:, 0], qk[:, 1], qkv[:, 2]))
        attn = F.scaled_dot_product_attention(q, k, v)  # [1, heads, N, d]
        x += lin(attn[0].transpose(0, 1).reshape(n, heads * d), lw.o_proj)
        gu = lin(rms_norm(x, lw.ffn_norm, c.eps), lw.gate_up_proj)  # [N, 2I]: gate | up
        act = self.act(gu[:, :inter]).mul_(gu[:, inter:])
        x += lin(act, lw.down_proj)
        return x
