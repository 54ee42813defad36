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
from engine.synth.spec import MM_PREFIXES, SynthSpec
from engine.synth.tensors import SynthTensor, decoder_plan, draw
from engine.synth.tokenizer import write_tokenizer_files
from engine.synth.vision import native_vision_params, vision_plan


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
