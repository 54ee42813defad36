"""Rotary embedding against transformers: YaRN / default inv_freq and attention factor,
the Llama-4 query scaling, and the folded rotation tables."""

from __future__ import annotations

import math

import pytest
import torch

from engine.config import RopeConfig
from engine.model.layers import (
    RopeTables,
    StepRope,
    apply_rope,
    llama4_query_scale,
    rope_attention_factor,
    rope_inv_freq,
)
from tests.engine.test_model_support import YARN, hf_rope_parameters

MINISTRAL = RopeConfig(theta=1e6, rope_type="yarn", factor=16.0,
                       original_max_position_embeddings=16384, beta_fast=32.0, beta_slow=1.0,
                       mscale=1.0, mscale_all_dim=1.0, llama_4_scaling_beta=0.1)
CASES = {
    "ministral3": (MINISTRAL, 128),
    "tiny_yarn": (YARN, 32),
    "yarn_mscale_differs": (RopeConfig(theta=1e4, rope_type="yarn", factor=4.0,
                                       original_max_position_embeddings=64, mscale=0.707,
                                       mscale_all_dim=1.0), 64),
    "yarn_no_mscale": (RopeConfig(theta=5e5, rope_type="yarn", factor=8.0,
                                  original_max_position_embeddings=32), 64),
    "default": (RopeConfig(theta=1e4), 64),
    # an explicit attention_factor and truncate: false (both were dropped: cos/sin and the
    # ramp then differed from transformers')
    "yarn_attention_factor": (RopeConfig(theta=1e4, rope_type="yarn", factor=4.0,
                                         original_max_position_embeddings=64,
                                         attention_factor=2.0), 64),
    "yarn_no_truncate": (RopeConfig(theta=1e4, rope_type="yarn", factor=4.0,
                                    original_max_position_embeddings=1000, truncate=False), 64),
}


def _hf(rope: RopeConfig, head_dim: int) -> tuple[torch.Tensor, float]:
    from transformers import Ministral3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    from transformers.models.ministral3.modeling_ministral3 import Ministral3RotaryEmbedding

    cfg = Ministral3Config(hidden_size=head_dim * 4, num_attention_heads=4, head_dim=head_dim,
                           max_position_embeddings=4096,
                           rope_parameters=hf_rope_parameters(rope))
    if rope.rope_type == "default":
        return Ministral3RotaryEmbedding.compute_default_rope_parameters(cfg)
    return ROPE_INIT_FUNCTIONS["yarn"](cfg)


@pytest.mark.parametrize("case", sorted(CASES))
def test_inv_freq_and_attention_factor_match_transformers(case: str) -> None:
    rope, d = CASES[case]
    inv_ref, factor_ref = _hf(rope, d)
    torch.testing.assert_close(rope_inv_freq(rope, d), inv_ref.float(), rtol=1e-6, atol=0)
    assert rope_attention_factor(rope) == pytest.approx(factor_ref, rel=1e-7)


def test_ministral_yarn_ramp_is_between_dims_20_and_37() -> None:
    """REFERENCE.md: theta 1e6, d 128, original 16384 -> low 20, high 37."""
    inv = rope_inv_freq(MINISTRAL, 128)
    extra = 1.0 / MINISTRAL.theta ** (torch.arange(0, 128, 2).float() / 128)
    torch.testing.assert_close(inv[:20], extra[:20])  # pure extrapolation below low
    torch.testing.assert_close(inv[37:], extra[37:] / 16.0)  # pure interpolation above high
    assert rope_attention_factor(MINISTRAL) == 1.0


def test_llama4_query_scale_matches_transformers() -> None:
    from transformers.models.ministral3.modeling_ministral3 import get_llama_4_attn_scale

    pos = torch.tensor([0, 1, 7, 8, 9, 15, 16, 40, 1000])
    ours = llama4_query_scale(YARN, pos)
    ref = get_llama_4_attn_scale(pos[None, :], 0.1, 8)[0, 0, :, 0]
    torch.testing.assert_close(ours, ref.float())
    assert ours[0] == 1.0 and ours[2] == 1.0  # below original_max_position_embeddings
    assert ours[3] == pytest.approx(1 + 0.1 * math.log(2))


def test_step_rope_rotates_q_and_k_like_transformers() -> None:
    from transformers.models.ministral3.modeling_ministral3 import apply_rotary_pos_emb

    d, hq, hkv = 32, 4, 2
    tables = RopeTables.build(YARN, d, 64)
    pos = torch.tensor([0, 5, 8, 20, 63])
    qk = torch.randn(len(pos), hq + hkv, d).to(torch.bfloat16)
    ang = pos.float()[:, None] * rope_inv_freq(YARN, d)[None, :]
    emb = torch.cat((ang, ang), -1)
    cos, sin = emb.cos(), emb.sin()  # [T, D]; unsqueezed to [T, 1, D] by transformers
    x = qk.float()
    ref_q, ref_k = apply_rotary_pos_emb(x[:, :hq], x[:, hq:], cos, sin, unsqueeze_dim=1)
    ref_q = ref_q * llama4_query_scale(YARN, pos)[:, None, None]
    out = apply_rope(qk, StepRope.select(tables, pos, hq, hkv))
    assert out.dtype == torch.bfloat16 and out.shape == qk.shape
    torch.testing.assert_close(out[:, :hq].float(), ref_q, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(out[:, hq:].float(), ref_k, rtol=1e-2, atol=1e-2)
    assert torch.equal(tables.q_cos[:8], tables.cos[:8])
    assert not torch.equal(tables.q_cos[8:], tables.cos[8:])


def test_step_rope_rejects_positions_past_the_table() -> None:
    tables = RopeTables.build(YARN, 16, 10)
    with pytest.raises(ValueError, match="max_model_len"):
        StepRope.select(tables, torch.tensor([3, 10]), 2, 1)


def test_beta_zero_shares_the_key_tables() -> None:
    tables = RopeTables.build(RopeConfig(theta=1e4), 16, 32)
    assert tables.q_cos is tables.cos and tables.q_sin is tables.sin
    assert tables.max_positions == 32
