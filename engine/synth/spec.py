"""What a synthesized checkpoint is (see engine/synth/checkpoint.py): its shape, layout,
quantization, tokenizer and seed, checked when made, and the published shapes as presets."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from engine.synth.tokenizer import FORMATS as TOKENIZER_FORMATS
from engine.synth.tokenizer import MIN_VOCAB
from engine.synth.vision import PIXTRAL_VISION, TINY_VISION, VisionShape

LAYOUTS = ("hf-multimodal", "hf-text", "native")
QUANTS = ("fp8-per-tensor", "fp8-block", "bf16")
MM_PREFIXES = ("language_model.model.", "model.language_model.")


@dataclass(frozen=True, slots=True)
class SynthSpec:
    """What to write. Defaults: a tiny FP8 per-tensor Ministral3ForCausalLM."""

    hidden_size: int = 256
    intermediate_size: int = 512
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    vocab_size: int = 1024
    tie_word_embeddings: bool = False
    layout: str = "hf-text"  # one of LAYOUTS
    mm_prefix: str = "language_model.model."  # hf-multimodal text prefix, one of MM_PREFIXES
    quant: str = "fp8-per-tensor"  # one of QUANTS
    scale_dtype: str = "bf16"  # "bf16" | "fp32": dtype of scales on disk
    rope: str = "yarn"  # "yarn" | "default"
    rope_theta: float = 1e6
    yarn_factor: float = 16.0
    original_max_position_embeddings: int = 16384
    max_position_embeddings: int = 262144
    llama_4_scaling_beta: float = 0.1  # 0 = off
    rms_norm_eps: float = 1e-5
    shard_bytes: int | None = None  # HF layouts: max bytes per shard; None = one file
    vision: VisionShape = TINY_VISION  # hf-multimodal, or native with native_vision
    native_vision: bool = False  # native layout: also a vision encoder (params.json block)
    tokenizer: str | bool = "tekken"  # one of TOKENIZER_FORMATS (True = "tekken", False = "none")
    seed: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.tokenizer, bool):  # the older on/off spelling
            object.__setattr__(self, "tokenizer", "tekken" if self.tokenizer else "none")
        checks = [
            (self.tokenizer in TOKENIZER_FORMATS,
             f"tokenizer {self.tokenizer!r} not in {TOKENIZER_FORMATS}"),
            (self.tokenizer == "none" or self.vocab_size >= MIN_VOCAB,
             f"a tokenizer needs vocab_size >= {MIN_VOCAB}"),
            (self.layout in LAYOUTS, f"layout {self.layout!r} not in {LAYOUTS}"),
            (self.quant in QUANTS, f"quant {self.quant!r} not in {QUANTS}"),
            (self.mm_prefix in MM_PREFIXES, f"mm_prefix {self.mm_prefix!r} not in {MM_PREFIXES}"),
            (self.rope in ("yarn", "default"), f"rope {self.rope!r} not yarn/default"),
            (self.scale_dtype in ("bf16", "fp32"), "scale_dtype must be bf16 or fp32"),
            (not (self.layout == "native" and self.quant == "fp8-block"),
             "native layout stores per-tensor FP8 only"),
            (min(self.hidden_size, self.intermediate_size, self.num_layers, self.num_heads,
                 self.num_kv_heads, self.vocab_size) > 0, "sizes must be > 0"),
            (self.num_heads % self.num_kv_heads == 0, "num_heads % num_kv_heads != 0"),
            (self.head_dim % 2 == 0, "head_dim must be even"),
            (self.shard_bytes is None or self.shard_bytes > 0, "shard_bytes must be > 0"),
        ]
        for ok, msg in checks:
            if not ok:
                raise ValueError(f"SynthSpec: {msg}")

    @classmethod
    def preset(cls, shape: str, **overrides: object) -> SynthSpec:
        if shape not in PRESETS:
            raise ValueError(f"unknown shape {shape!r}; choose from {', '.join(PRESETS)}")
        return dataclasses.replace(PRESETS[shape], **overrides)  # type: ignore[arg-type]


PRESETS: dict[str, SynthSpec] = {
    "tiny": SynthSpec(original_max_position_embeddings=32, max_position_embeddings=512,
                      tokenizer="none"),
    "ministral-3-3b": SynthSpec(
        hidden_size=3072, intermediate_size=9216, num_layers=26, num_heads=32, num_kv_heads=8,
        head_dim=128, vocab_size=131072, tie_word_embeddings=True, layout="hf-multimodal",
        vision=PIXTRAL_VISION, shard_bytes=4 << 30),
    # the demo model's shapes (SmolLM2-135M as engine/demo_model converts it: Ministral3 text
    # layout, per-tensor FP8, tied, plain RoPE): its decode work without its GGUF
    "smollm2-135m": SynthSpec(
        hidden_size=576, intermediate_size=1536, num_layers=30, num_heads=9, num_kv_heads=3,
        head_dim=64, vocab_size=49152, tie_word_embeddings=True, rope="default",
        rope_theta=1e5, original_max_position_embeddings=8192, max_position_embeddings=8192,
        llama_4_scaling_beta=0.0),
    "ministral-3-8b": SynthSpec(
        hidden_size=4096, intermediate_size=14336, num_layers=34, num_heads=32, num_kv_heads=8,
        head_dim=128, vocab_size=131072, tie_word_embeddings=False, layout="hf-multimodal",
        vision=PIXTRAL_VISION, shard_bytes=4 << 30),
}
