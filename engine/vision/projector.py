"""The multimodal projector: tower features of one image -> text-model embeddings.

    features [gh*gw, D] bf16 (patches row-major) --RMSNorm--> 2x2 unfold (stride 2) over
    the gh x gw grid: [gh/2 * gw/2, 4D], merged tokens row-major, each vector channel-major
    (index c*4 + ki*2 + kj, as torch.nn.functional.unfold orders it) --merging_layer-->
    [T, D] --linear_1--> [T, H] --exact GELU--> --linear_2--> [T, H] bf16
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from engine.model.layers import rms_norm
from engine.vision.gemm import VisionGemm
from engine.vision.weights import VisionWeights


def unfold_merge(x: torch.Tensor, gh: int, gw: int, m: int) -> torch.Tensor:
    """x [gh*gw, D] -> [(gh/m)*(gw/m), D*m*m], element [t, c*m*m + ki*m + kj] =
    x[(m*ti + ki)*gw + m*tj + kj, c] for merged token t = ti*(gw/m) + tj."""
    n, d = x.shape
    if n != gh * gw or gh % m or gw % m:
        raise ValueError(f"{n} patches do not form a {gh}x{gw} grid divisible by {m}")
    grid = x.view(gh // m, m, gw // m, m, d).permute(0, 2, 4, 1, 3)
    return grid.reshape((gh // m) * (gw // m), d * m * m)


class Projector:
    def __init__(self, weights: VisionWeights, gemm: VisionGemm) -> None:
        self.w = weights
        self.config = weights.config
        self.gemm = gemm

    @torch.inference_mode()
    def __call__(self, features: torch.Tensor, gh: int, gw: int) -> torch.Tensor:
        """features [gh*gw, D] (gemm.act_dtype) -> [(gh/2)*(gw/2), H] bf16."""
        c, w, lin = self.config, self.w, self.gemm.linear
        x = rms_norm(features, w.projector_norm, c.projector_eps)
        x = lin(unfold_merge(x, gh, gw, c.spatial_merge_size), w.merging_layer)
        return lin(F.gelu(lin(x, w.linear_1)), w.linear_2).to(torch.bfloat16)
