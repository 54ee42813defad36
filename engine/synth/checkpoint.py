"""Random-weight checkpoints in the published Ministral-3 layouts, for tests and benchmarks.

    spec = SynthSpec.preset("tiny", layout="native", seed=3)
    result = write_checkpoint(out_dir, spec)

Layouts: "hf-multimodal" (Mistral3ForConditionalGeneration, vision tower + projector
tensors; text under ``language_model.model.*`` with head ``language_model.lm_head.weight``,
or with mm_prefix="model.language_model." under ``model.language_model.*`` / ``lm_head``),
"hf-text" (Ministral3ForCausalLM, ``model.*``), "native" (params.json +
consolidated.safetensors; wq/wk rows interleaved). Weights are drawn per tensor from
(seed, canonical name), so one seed gives the same model in every layout. Tensors are
generated and written one at a time (streaming safetensors writer): memory stays at the
largest tensor, whatever the model size. lm_head is always bf16 (modules_to_not_convert)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from engine.checkpoint.names import NameMap
from engine.synth.configs import hf_multimodal_config, hf_text_config, native_params
from engine.synth.files import (
    SafetensorsStreamWriter,
    TensorEntry,
    generation_config,
    shard_entries,
    write_json,
)
from engine.synth.tensors import SynthTensor, decoder_plan, draw
from engine.synth.tokenizer import FORMATS as TOKENIZER_FORMATS
from engine.synth.tokenizer import MIN_VOCAB, write_tokenizer_files
from engine.synth.vision import (
    PIXTRAL_VISION,
    TINY_VISION,
    VisionShape,
    native_vision_params,
    vision_plan,
)

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
    "ministral-3-8b": SynthSpec(
        hidden_size=4096, intermediate_size=14336, num_layers=34, num_heads=32, num_kv_heads=8,
        head_dim=128, vocab_size=131072, tie_word_embeddings=False, layout="hf-multimodal",
        vision=PIXTRAL_VISION, shard_bytes=4 << 30),
}


@dataclass(frozen=True, slots=True)
class SynthResult:
    out_dir: Path
    files: tuple[str, ...]  # every file written, relative to out_dir
    nbytes: int  # total bytes of those files


def tensor_plan(spec: SynthSpec) -> list[SynthTensor]:
    """Every tensor the checkpoint holds, in write order."""
    if spec.layout == "native":
        names = NameMap(native=True)
    elif spec.layout == "hf-text":
        names = NameMap(native=False, prefix="model.", head="lm_head.weight")
    else:
        legacy = spec.mm_prefix == MM_PREFIXES[0]
        head = "language_model.lm_head.weight" if legacy else "lm_head.weight"
        names = NameMap(native=False, prefix=spec.mm_prefix, head=head)
    dims = {"hidden": spec.hidden_size, "intermediate": spec.intermediate_size,
            "layers": spec.num_layers, "heads": spec.num_heads, "kv_heads": spec.num_kv_heads,
            "head_dim": spec.head_dim, "vocab": spec.vocab_size}
    scale_dtype = torch.bfloat16 if spec.scale_dtype == "bf16" else torch.float32
    plan = decoder_plan(names, dims, spec.quant, spec.tie_word_embeddings, scale_dtype)
    if spec.layout == "hf-multimodal":
        vprefix = "" if spec.mm_prefix == MM_PREFIXES[0] else "model."
        plan += vision_plan(spec.vision, spec.hidden_size, vprefix)
    elif spec.layout == "native" and spec.native_vision:
        plan += vision_plan(spec.vision, spec.hidden_size, "", native=True)
    return plan


def _write_shards(out: Path, plan: list[SynthTensor], spec: SynthSpec) -> list[str]:
    by_name = {t.entry.name: t for t in plan}
    entries: list[TensorEntry] = [t.entry for t in plan]
    native = spec.layout == "native"
    groups = shard_entries(entries, None if native else spec.shard_bytes)
    if native:
        files = ["consolidated.safetensors"]
    elif len(groups) == 1 and spec.shard_bytes is None:
        files = ["model.safetensors"]
    else:
        files = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    for file, group in zip(files, groups, strict=True):
        writer = SafetensorsStreamWriter(out / file, group)
        for e in group:
            writer.write(e.name, draw(by_name[e.name], spec.seed))
        writer.close()
    if len(files) > 1 or files[0].startswith("model-"):
        weight_map = {e.name: f for f, g in zip(files, groups, strict=True) for e in g}
        total = sum(e.nbytes for e in entries)
        write_json(out / "model.safetensors.index.json",
                   {"metadata": {"total_size": total}, "weight_map": weight_map})
        files.append("model.safetensors.index.json")
    return files


def image_config(spec: SynthSpec) -> dict[str, int] | None:
    """tekken.json's ``image`` block (mistral-common ImageConfig) for the multimodal layout."""
    if spec.layout != "hf-multimodal" and not (spec.layout == "native" and spec.native_vision):
        return None
    return {"image_patch_size": spec.vision.patch_size, "max_image_size": spec.vision.image_size,
            "spatial_merge_size": 2}


def write_checkpoint(out_dir: Path, spec: SynthSpec) -> SynthResult:
    """Write the checkpoint described by ``spec`` into ``out_dir`` (created if needed)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    files = _write_shards(out, tensor_plan(spec), spec)
    if spec.layout == "native":
        params = native_params(spec)
        if spec.native_vision:
            params["vision_encoder"] = native_vision_params(spec.vision)
        write_json(out / "params.json", params)
        files.append("params.json")
    else:
        cfg = hf_multimodal_config(spec) if spec.layout == "hf-multimodal" else hf_text_config(spec)
        write_json(out / "config.json", cfg)
        files.append("config.json")
    write_json(out / "generation_config.json", generation_config())
    files.append("generation_config.json")
    files += write_tokenizer_files(out, str(spec.tokenizer), spec.vocab_size, image_config(spec))
    nbytes = sum((out / f).stat().st_size for f in files)
    return SynthResult(out_dir=out, files=tuple(files), nbytes=nbytes)
