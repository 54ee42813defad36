"""TensorStore + NameMap + ModelConfig -> ModelWeights (the canonical layout of
engine/weights.py). FP8 weights stay memory-mapped FP8; scales become fp32."""

from __future__ import annotations

import math
import sys

import torch
from tqdm import tqdm

from engine.checkpoint.errors import CheckpointError
from engine.checkpoint.names import LINEAR_MODULES, NameMap, module_excluded
from engine.checkpoint.tensors import TensorStore
from engine.checkpoint.validate import read_float, read_fp8, read_scale
from engine.config import ModelConfig
from engine.kernels.base import FP8_DTYPE, Fp8Weight, ScaleKind
from engine.weights import LayerWeights, LinearWeight, ModelWeights

IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)  # buffers some older HF checkpoints saved


def linear_shapes(cfg: ModelConfig) -> dict[str, tuple[int, int]]:
    """[N, K] of each decoder linear."""
    h, i = cfg.hidden_size, cfg.intermediate_size
    return {"q_proj": (cfg.q_size, h), "k_proj": (cfg.kv_size, h), "v_proj": (cfg.kv_size, h),
            "o_proj": (h, cfg.q_size), "gate_proj": (i, h), "up_proj": (i, h),
            "down_proj": (h, i)}


def is_fp8(cfg: ModelConfig, module: str) -> bool:
    """module: canonical module name, e.g. layers.0.self_attn.q_proj or lm_head."""
    excluded = module_excluded(module, cfg.quant.modules_to_not_convert)
    return cfg.quant.method == "fp8" and not excluded


def needs_act_scale(cfg: ModelConfig) -> bool:
    return cfg.quant.activation_scheme == "static" and cfg.quant.scale_kind is ScaleKind.PER_TENSOR


def known_names(cfg: ModelConfig, names: NameMap) -> tuple[list[str], set[str]]:
    """(required disk names, every disk name the text decoder may use)."""
    required = ["embed_tokens.weight", "norm.weight"]
    modules = [("lm_head", None)] if not cfg.tie_word_embeddings else []
    # a tied checkpoint may still carry a copy of the head (in HF files quantized too, with
    # its scales): unused, not an error
    copies = ("weight",) if names.native else ("weight", "weight_scale_inv", "activation_scale")
    optional = [f"lm_head.{n}" for n in copies] if cfg.tie_word_embeddings else []
    for i in range(cfg.num_layers):
        required += [f"layers.{i}.input_layernorm.weight",
                     f"layers.{i}.post_attention_layernorm.weight"]
        modules += [(f"layers.{i}.{m}", None) for m in LINEAR_MODULES.values()]
    for module, _ in modules:
        required.append(f"{module}.weight")
        if is_fp8(cfg, module):
            required.append(f"{module}.weight_scale_inv")
            (required if needs_act_scale(cfg) else optional).append(f"{module}.activation_scale")
    req = [names.disk(c) for c in required]
    kv = set() if names.native else {names.prefix + n for n in kv_scale_names(cfg)}
    return req, set(req) | {names.disk(c) for c in optional} | kv


def kv_scale_names(cfg: ModelConfig) -> list[str]:
    """Canonical names of the optional static KV-cache scales (HF FP8 KV checkpoints)."""
    return [f"layers.{i}.self_attn.{kv}_scale" for i in range(cfg.num_layers)
            for kv in ("k", "v")]


def load_kv_scales(store: TensorStore, cfg: ModelConfig,
                   names: NameMap) -> tuple[tuple[float, float], ...] | None:
    """Each layer's static (k_scale, v_scale) dequant multipliers, or None when the
    checkpoint has none (all layers or none: a partial set is an error)."""
    disk = [] if names.native else [names.prefix + n for n in kv_scale_names(cfg)]
    present = [n for n in disk if n in store]
    if not present:
        return None
    if len(present) != len(disk):
        missing = next(n for n in disk if n not in store)
        raise CheckpointError(f"{store.meta(present[0]).file}: tensor '{missing}' missing "
                              f"(a KV-cache scale: '{present[0]}' and others are present)")
    vals = [float(read_scale(store, n, ())) for n in disk]
    return tuple((vals[2 * i], vals[2 * i + 1]) for i in range(cfg.num_layers))


def check_names(store: TensorStore, cfg: ModelConfig, names: NameMap, source: str) -> int:
    """Raise for the first missing or unexpected tensor; return the vision tensor count."""
    last = names.disk(f"layers.{cfg.num_layers - 1}.input_layernorm.weight")
    if last not in store:  # before listing every layer's names (a config may say 10^12)
        raise CheckpointError(f"{source}: tensor '{last}' missing (the config gives "
                              f"{cfg.num_layers} layers)")
    required, known = known_names(cfg, names)
    for name in required:
        if name not in store:
            hint = "" if names.native else _missing_hint(store, name)
            raise CheckpointError(f"{source}: tensor '{name}' missing{hint}")
    vision = 0
    for name in store.names():
        if name in known or name.endswith(IGNORED_SUFFIXES):
            continue
        if names.is_vision(name):
            vision += 1
            continue
        why = (_excluded_scale(store, cfg, names, name) or _scale_without_quant(cfg, names, name)
               or "not part of the text decoder, not a vision tensor")
        raise CheckpointError(f"{store.meta(name).file}: tensor '{name}' unexpected ({why})")
    return vision


def _excluded_scale(store: TensorStore, cfg: ModelConfig, names: NameMap, name: str) -> str:
    """For the FP8 scale of a decoder linear that modules_to_not_convert names (so no scale
    is read for it): what the config says and what the weight is (else '')."""
    suffix = next((s for s in (".weight_scale_inv", ".activation_scale")
                   if name.endswith(s)), None)
    if suffix is None or names.native or cfg.quant.method != "fp8":
        return ""
    weight = name[: -len(suffix)] + ".weight"
    canonical = {names.disk(f"layers.{i}.{m}.weight"): f"layers.{i}.{m}"
                 for i in range(cfg.num_layers) for m in LINEAR_MODULES.values()}
    module = canonical.get(weight, "lm_head" if weight == names.disk("lm_head.weight") else None)
    if module is None or weight not in store or is_fp8(cfg, module):
        return ""
    dtype = str(store.meta(weight).dtype).removeprefix("torch.")
    return (f"a scale of '{weight[: -len('.weight')]}', which config.json quantization_config."
            f"modules_to_not_convert lists, so it is read unquantized; its weight is {dtype}"
            + (": remove the module from that list" if store.meta(weight).dtype == FP8_DTYPE
               else ", so the scale is stray"))


SCALE_SUFFIXES = (".weight_scale_inv", ".weight_scale", ".activation_scale", ".input_scale",
                  ".qscale_weight", ".qscale_act")


def _scale_without_quant(cfg: ModelConfig, names: NameMap, name: str) -> str:
    """For an FP8 scale in a checkpoint whose config declares no quantization (every
    linear is then read as bf16): the config key that is missing (else '')."""
    if cfg.quant.method != "none" or not name.endswith(SCALE_SUFFIXES):
        return ""
    if names.native:
        return ("an FP8 scale, but params.json has no quantization section, so the "
                "checkpoint is read as bf16; an FP8 one has quantization.qformat_weight "
                "fp8_e4m3")
    return ("an FP8 scale, but config.json has no quantization_config, so the checkpoint "
            "is read as bf16; an FP8 one has quantization_config.quant_method fp8")


def _missing_hint(store: TensorStore, missing: str) -> str:
    """Why a required tensor may be missing: its FP8 scale stored under the other name
    (``weight_scale``, compressed-tensors' spelling, for quant_method fp8's
    ``weight_scale_inv``), or its weight stored unquantized (else '')."""
    other = missing.removesuffix("_inv")
    if missing.endswith(".weight_scale_inv") and other in store:
        return (f" ('{other}' is there: quant_method fp8 names the weight's dequantization "
                "multiplier weight_scale_inv)")
    return _unquantized(store, missing)


def _unquantized(store: TensorStore, missing: str) -> str:
    """For a missing FP8 scale whose weight is stored unquantized: the config key that
    should name the module (else '')."""
    suffix = ".weight_scale_inv" if missing.endswith(".weight_scale_inv") else (
        ".activation_scale" if missing.endswith(".activation_scale") else None)
    if suffix is None:
        return ""
    weight = missing[: -len(suffix)] + ".weight"
    if weight not in store or store.meta(weight).dtype == FP8_DTYPE:
        return ""
    module = weight.removesuffix(".weight")
    return (f" ('{weight}' is {str(store.meta(weight).dtype).removeprefix('torch.')}, not "
            f"FP8: config.json quantization_config.modules_to_not_convert should list "
            f"'{module}')")


def interleaved_to_half_split(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows [n_heads*head_dim, K] in the interleaved RoPE layout (Mistral-native wq/wk:
    pairs (2j, 2j+1)) -> half-split layout (j, j + head_dim/2). Returns a contiguous copy."""
    n, k = w.shape
    hd = n // n_heads
    return w.view(n_heads, hd // 2, 2, k).transpose(1, 2).reshape(n, k).contiguous()


def load_linear(store: TensorStore, cfg: ModelConfig, names: NameMap, module: str,
                shape: tuple[int, int], rope_heads: int | None = None) -> LinearWeight:
    """One linear. rope_heads: permute rows interleaved -> half-split (native wq/wk)."""
    wname = names.disk(f"{module}.weight")
    if not is_fp8(cfg, module):
        w = read_float(store, wname, shape)
        return w if rope_heads is None else interleaved_to_half_split(w, rope_heads)
    w = read_fp8(store, wname, shape)
    if rope_heads is not None:
        w = interleaved_to_half_split(w, rope_heads)
    kind, block = cfg.quant.scale_kind, cfg.quant.block_size
    sshape = () if kind is ScaleKind.PER_TENSOR else (
        math.ceil(shape[0] / block[0]), math.ceil(shape[1] / block[1]))
    scale = read_scale(store, names.disk(f"{module}.weight_scale_inv"), sshape)
    aname = names.disk(f"{module}.activation_scale")
    act = read_scale(store, aname, ()) if aname in store else None
    return Fp8Weight(weight=w, scale=scale, scale_kind=kind, activation_scale=act,
                     block_size=block)


def load_layer(store: TensorStore, cfg: ModelConfig, names: NameMap, i: int) -> LayerWeights:
    h = cfg.hidden_size
    linears = {}
    rope_heads = {"q_proj": cfg.num_heads, "k_proj": cfg.num_kv_heads}
    for lin, (n, k) in linear_shapes(cfg).items():
        heads = rope_heads.get(lin) if names.native else None
        module = f"layers.{i}.{LINEAR_MODULES[lin]}"
        linears[lin] = load_linear(store, cfg, names, module, (n, k), heads)
    return LayerWeights(
        input_layernorm=read_float(store, names.disk(f"layers.{i}.input_layernorm.weight"), (h,)),
        post_attention_layernorm=read_float(
            store, names.disk(f"layers.{i}.post_attention_layernorm.weight"), (h,)),
        **linears,
    )


def assemble(store: TensorStore, cfg: ModelConfig, names: NameMap, progress: bool) -> ModelWeights:
    v, h = cfg.vocab_size, cfg.hidden_size
    bar = tqdm(total=cfg.num_layers + 2, desc="loading weights", unit="part", file=sys.stderr,
               disable=not progress, leave=False)
    with bar:
        embed = read_float(store, names.disk("embed_tokens.weight"), (v, h))
        bar.update(1)
        layers = []
        for i in range(cfg.num_layers):
            layers.append(load_layer(store, cfg, names, i))
            bar.update(1)
        norm = read_float(store, names.disk("norm.weight"), (h,))
        head = None
        if not cfg.tie_word_embeddings:
            head = load_linear(store, cfg, names, "lm_head", (v, h))
        bar.update(1)
    return ModelWeights(config=cfg, embed_tokens=embed, layers=tuple(layers), norm=norm,
                        lm_head=head, kv_scales=load_kv_scales(store, cfg, names))
