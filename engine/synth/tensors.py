"""What a synthesized checkpoint contains (the tensor plan) and how each tensor is drawn.

Every tensor is drawn from its own generator seeded by (seed, canonical name), so the same
seed gives the same weights in every layout, shard split and write order. Distributions
keep activations sane: linear weights have std 1/sqrt(K) after dequantization, norms ~1,
embeddings std 1/sqrt(H) (so tied logits have std ~1). FP8 weights are drawn as codes:
N(0, 64) clamped to +-448 and cast (never a NaN code), with scale = std / 64."""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass

import torch

from engine.checkpoint.names import LINEAR_MODULES, NameMap
from engine.synth.files import TensorEntry

FP8 = torch.float8_e4m3fn
CODE_STD = 64.0
CHUNK_ELEMS = 1 << 24


@dataclass(frozen=True, slots=True)
class SynthTensor:
    entry: TensorEntry  # name on disk, dtype, shape
    key: str  # RNG key: the canonical name (layout independent)
    kind: str  # embed | norm | fp8 | bf16 | wscale | ascale | vision | vision_norm
    std: float = 1.0  # target std after dequantization (linears, embed)
    rope_heads: int | None = None  # native wq/wk: write rows interleaved


def _gen(seed: int, key: str) -> torch.Generator:
    return torch.Generator().manual_seed(zlib.crc32(f"{seed}/{key}".encode()))


def _randn(shape: tuple[int, ...], g: torch.Generator, std: float, dtype: torch.dtype,
           clamp: float | None = None) -> torch.Tensor:
    """randn * std cast to dtype, drawn in row chunks (bounded fp32 temporaries)."""
    out = torch.empty(shape, dtype=dtype)
    flat = out.view(shape[0], -1) if len(shape) > 1 else out.view(1, -1)
    rows = max(1, CHUNK_ELEMS // max(1, flat.shape[1]))
    for r in range(0, flat.shape[0], rows):
        x = torch.randn(flat[r:r + rows].shape, generator=g).mul_(std)
        if clamp is not None:
            x.clamp_(-clamp, clamp)
        flat[r:r + rows] = x.to(dtype)
    return out


def half_split_to_interleaved(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Inverse of engine.checkpoint.assemble.interleaved_to_half_split."""
    n, k = w.shape
    return w.view(n_heads, 2, n // n_heads // 2, k).transpose(1, 2).reshape(n, k).contiguous()


def draw(t: SynthTensor, seed: int) -> torch.Tensor:
    """The tensor for one plan entry, dtype/shape exactly as in t.entry."""
    e, g = t.entry, _gen(seed, t.key)
    if t.kind in ("norm", "vision_norm"):
        x = 1.0 + 0.1 * torch.randn(e.shape, generator=g)
        return x.to(e.dtype)
    if t.kind == "fp8":
        x = _randn(e.shape, g, CODE_STD, FP8, clamp=448.0)
    elif t.kind in ("bf16", "embed", "vision"):
        x = _randn(e.shape, g, t.std, e.dtype)
    elif t.kind == "wscale":
        x = (t.std / CODE_STD) * (0.75 + 0.5 * torch.rand(e.shape, generator=g))
        return x.to(e.dtype)
    elif t.kind == "ascale":
        return (0.05 + 0.05 * torch.rand(e.shape, generator=g)).to(e.dtype)
    else:
        raise ValueError(f"unknown tensor kind {t.kind}")
    return x if t.rope_heads is None else half_split_to_interleaved(x, t.rope_heads)


def linear_plan(names: NameMap, module: str, n: int, k: int, quant: str,
                scale_dtype: torch.dtype, rope_heads: int | None,
                block: tuple[int, int] = (128, 128)) -> list[SynthTensor]:
    """weight (+ weight_scale_inv + activation_scale for FP8) of one linear."""
    std = 1.0 / math.sqrt(k)
    wkey = f"{module}.weight"
    if quant == "bf16" or module == "lm_head":
        return [SynthTensor(TensorEntry(names.disk(wkey), torch.bfloat16, (n, k)), wkey, "bf16",
                            std, rope_heads)]
    sshape = () if quant == "fp8-per-tensor" else (math.ceil(n / block[0]), math.ceil(k / block[1]))
    plan = [SynthTensor(TensorEntry(names.disk(wkey), FP8, (n, k)), wkey, "fp8", std, rope_heads)]
    skey = f"{module}.weight_scale_inv"
    plan.append(SynthTensor(TensorEntry(names.disk(skey), scale_dtype, sshape), skey, "wscale",
                            std))
    if quant == "fp8-per-tensor":
        akey = f"{module}.activation_scale"
        plan.append(SynthTensor(TensorEntry(names.disk(akey), scale_dtype, ()), akey, "ascale"))
    return plan


def decoder_plan(names: NameMap, dims: dict[str, int], quant: str, tied: bool,
                 scale_dtype: torch.dtype) -> list[SynthTensor]:
    """Every text-decoder tensor. dims: hidden, intermediate, layers, heads, kv_heads,
    head_dim, vocab."""
    h, inter, v = dims["hidden"], dims["intermediate"], dims["vocab"]
    q, kv = dims["heads"] * dims["head_dim"], dims["kv_heads"] * dims["head_dim"]
    shapes = {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
              "gate_proj": (inter, h), "up_proj": (inter, h), "down_proj": (h, inter)}
    bf = torch.bfloat16
    plan = [SynthTensor(TensorEntry(names.disk("embed_tokens.weight"), bf, (v, h)),
                        "embed_tokens.weight", "embed", 1.0 / math.sqrt(h))]
    for i in range(dims["layers"]):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            key = f"layers.{i}.{norm}.weight"
            plan.append(SynthTensor(TensorEntry(names.disk(key), bf, (h,)), key, "norm"))
        for lin, (n, k) in shapes.items():
            heads = {"q_proj": dims["heads"], "k_proj": dims["kv_heads"]}.get(lin)
            plan += linear_plan(names, f"layers.{i}.{LINEAR_MODULES[lin]}", n, k, quant,
                                scale_dtype, heads if names.native else None)
    plan.append(SynthTensor(TensorEntry(names.disk("norm.weight"), bf, (h,)), "norm.weight",
                            "norm"))
    if not tied:
        plan += linear_plan(names, "lm_head", v, h, quant, scale_dtype, None)
    return plan
