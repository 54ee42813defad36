"""Tensor names: one canonical scheme, and its spelling on disk per layout.

Canonical names are the Hugging Face text-decoder names without a prefix::

    embed_tokens.weight  norm.weight  lm_head.weight
    layers.{i}.input_layernorm.weight  layers.{i}.post_attention_layernorm.weight
    layers.{i}.self_attn.{q,k,v,o}_proj.{weight,weight_scale_inv,activation_scale}
    layers.{i}.mlp.{gate,up,down}_proj.{weight,weight_scale_inv,activation_scale}

On disk: HF checkpoints add one prefix (``language_model.model.``,
``model.language_model.`` or ``model.``) and name the head ``language_model.lm_head.weight``
or ``lm_head.weight``; Mistral-native checkpoints use their own names (see NATIVE_*)."""

from __future__ import annotations

from dataclasses import dataclass

from engine.checkpoint.errors import CheckpointError

LINEAR_MODULES = {
    "q_proj": "self_attn.q_proj",
    "k_proj": "self_attn.k_proj",
    "v_proj": "self_attn.v_proj",
    "o_proj": "self_attn.o_proj",
    "gate_proj": "mlp.gate_proj",
    "up_proj": "mlp.up_proj",
    "down_proj": "mlp.down_proj",
}
HF_PREFIXES = ("language_model.model.", "model.language_model.", "model.")
HF_HEADS = ("language_model.lm_head.weight", "lm_head.weight")
HF_VISION_PREFIXES = (
    "vision_tower.", "multi_modal_projector.",
    "model.vision_tower.", "model.multi_modal_projector.",
)
NATIVE_VISION_PREFIXES = (
    "vision_encoder.", "vision_language_adapter.", "patch_merger.", "pre_mm_projector_norm.",
)
NATIVE_MODULES = {
    "self_attn.q_proj": "attention.wq",
    "self_attn.k_proj": "attention.wk",
    "self_attn.v_proj": "attention.wv",
    "self_attn.o_proj": "attention.wo",
    "mlp.gate_proj": "feed_forward.w1",
    "mlp.down_proj": "feed_forward.w2",
    "mlp.up_proj": "feed_forward.w3",
    "input_layernorm": "attention_norm",
    "post_attention_layernorm": "ffn_norm",
}
NATIVE_SUFFIXES = {
    "weight": "weight", "weight_scale_inv": "qscale_weight", "activation_scale": "qscale_act",
}
NATIVE_TOP = {"embed_tokens.weight": "tok_embeddings.weight", "norm.weight": "norm.weight",
              "lm_head.weight": "output.weight"}


def linear_name(layer: int, linear: str, suffix: str = "weight") -> str:
    """Canonical name, e.g. linear_name(3, "q_proj") -> layers.3.self_attn.q_proj.weight."""
    return f"layers.{layer}.{LINEAR_MODULES[linear]}.{suffix}"


@dataclass(frozen=True, slots=True)
class NameMap:
    """Canonical name -> name on disk for one checkpoint."""

    native: bool
    prefix: str = ""  # HF only
    head: str = "lm_head.weight"  # HF only

    def disk(self, canonical: str) -> str:
        if self.native:
            return _native_name(canonical)
        if canonical.startswith("lm_head."):  # the head's weight and its FP8 scales
            return self.head.removesuffix("lm_head.weight") + canonical
        return self.prefix + canonical

    def is_vision(self, disk_name: str) -> bool:
        prefixes = NATIVE_VISION_PREFIXES if self.native else HF_VISION_PREFIXES
        return disk_name.startswith(prefixes)


def _native_name(canonical: str) -> str:
    if canonical in NATIVE_TOP:
        return NATIVE_TOP[canonical]
    _, layer, rest = canonical.split(".", 2)
    module, suffix = rest.rsplit(".", 1)
    return f"layers.{layer}.{NATIVE_MODULES[module]}.{NATIVE_SUFFIXES[suffix]}"


def hf_name_map(names: list[str], file: str) -> NameMap:
    """Pick the prefix that holds ``embed_tokens.weight`` and the head name in use."""
    present = set(names)
    for prefix in HF_PREFIXES:
        if prefix + "embed_tokens.weight" in present:
            break
    else:
        tried = ", ".join(p + "embed_tokens.weight" for p in HF_PREFIXES)
        raise CheckpointError(f"{file}: tensor 'embed_tokens.weight' missing (looked for {tried})")
    head = next((h for h in HF_HEADS if h in present), None)
    if head is None:
        head = HF_HEADS[0] if prefix == "language_model.model." else HF_HEADS[1]
    return NameMap(native=False, prefix=prefix, head=head)


def strip_known_prefix(name: str) -> str:
    """``model.language_model.layers.0.mlp`` -> ``layers.0.mlp``; ``language_model.lm_head``
    -> ``lm_head``. Used to compare modules_to_not_convert entries with module names."""
    for prefix in HF_PREFIXES + ("language_model.",):
        if name.startswith(prefix):
            return name[len(prefix):]
    return name


def module_excluded(canonical_module: str, not_convert: tuple[str, ...]) -> bool:
    """True when a modules_to_not_convert entry names this module or a parent of it."""
    for entry in not_convert:
        e = strip_known_prefix(entry)
        if canonical_module == e or canonical_module.startswith(e + "."):
            return True
    return False
