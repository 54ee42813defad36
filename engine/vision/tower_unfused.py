"""UnfusedTower: the vision tower layer as first written, three q/k/v GEMMs and two
gate/up GEMMs on views of the fused weights (VisionLayerWeights.part), contiguous
copies around SDPA and the textbook RoPE. The reference the fused VisionTower is
checked against (tests/engine/vision/test_tower_fusion.py) and timed beside
(``fp8serve bench vision --compare-unfused``); never used to serve."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.model.layers import rms_norm
from engine.vision.activation import activation
from engine.vision.tower import VisionTower
from engine.vision.weights import VisionLayerWeights


def rope_textbook(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, heads, d] -> x * cos + cat(-x2, x1) * sin."""
    half = x.shape[-1] // 2
    return x * cos + torch.cat((-x[..., half:], x[..., :half]), dim=-1) * sin


class UnfusedTower(VisionTower):
    def _layer(self, x: torch.Tensor, lw: VisionLayerWeights, cos: torch.Tensor,
               sin: torch.Tensor) -> torch.Tensor:
        """x [N, D] -> [N, D], both gemm.act_dtype."""
        c, lin = self.config, self.gemm.linear
        n, heads, d = x.shape[0], c.num_heads, c.head_dim
        h = rms_norm(x, lw.attention_norm, c.eps)
        q = rope_textbook(lin(h, lw.part("q_proj")).view(n, heads, d), cos, sin)
        k = rope_textbook(lin(h, lw.part("k_proj")).view(n, heads, d), cos, sin)
        v = lin(h, lw.part("v_proj")).view(n, heads, d)
        attn = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                              v.transpose(0, 1)[None])
        x = x + lin(attn[0].transpose(0, 1).reshape(n, heads * d), lw.o_proj)
        h = rms_norm(x, lw.ffn_norm, c.eps)
        gate, up = lin(h, lw.part("gate_proj")), lin(h, lw.part("up_proj"))
        return x + lin(activation(c.hidden_act)(gate) * up, lw.down_proj)
