"""Public entry points for reading a checkpoint directory.

    read_model_config(dir) -> ModelConfig     config files only, no tensors
    load_weights(dir)      -> ModelWeights    every text-decoder tensor, canonical layout

Layouts (detected from the files, see engine/checkpoint/detect.py): Hugging Face
config.json + model.safetensors / shards + index (Mistral3ForConditionalGeneration,
Ministral3ForCausalLM, MistralForCausalLM, LlamaForCausalLM) and Mistral-native
params.json + consolidated.safetensors. Vision tensors are counted here and read by
engine/vision/encoder.py (load_vision_encoder) when images are served.
Any problem raises engine.checkpoint.errors.CheckpointError with a one-line message
naming the file and tensor."""

from __future__ import annotations

import logging
from pathlib import Path

from engine.checkpoint.assemble import assemble, check_names
from engine.checkpoint.detect import HF_INDEX, HF_SINGLE, NATIVE_WEIGHTS, Layout, detect_layout
from engine.checkpoint.errors import CheckpointError
from engine.checkpoint.hf_config import parse_hf_config
from engine.checkpoint.names import NameMap, hf_name_map
from engine.checkpoint.native_config import parse_native_config
from engine.checkpoint.tensors import TensorStore
from engine.config import ModelConfig
from engine.weights import ModelWeights

__all__ = ["CheckpointError", "load_weights", "read_model_config"]

log = logging.getLogger(__name__)


def read_model_config(model_dir: Path, layout: Layout | str | None = None) -> ModelConfig:
    """Parse the checkpoint's config files (cheap: no tensor data is touched); ``layout``:
    the one to read where a directory holds both (detect_layout)."""
    layout = detect_layout(Path(model_dir), layout)
    if layout is Layout.NATIVE:
        return parse_native_config(Path(model_dir))
    return parse_hf_config(Path(model_dir))


def open_store(model_dir: Path, layout: Layout | str | None = None
               ) -> tuple[TensorStore, NameMap, str]:
    """(tensor store, name map, the file to name for missing tensors)."""
    layout = detect_layout(Path(model_dir), layout)
    if layout is Layout.NATIVE:
        return TensorStore(Path(model_dir), [NATIVE_WEIGHTS]), NameMap(native=True), NATIVE_WEIGHTS
    store = TensorStore.open_files(Path(model_dir), HF_SINGLE, HF_INDEX)
    source = HF_INDEX if (Path(model_dir) / HF_INDEX).exists() else HF_SINGLE
    return store, hf_name_map(store.names(), source), source


def load_weights(model_dir: Path, progress: bool = True,
                 layout: Layout | str | None = None) -> ModelWeights:
    """Load and validate every text-decoder tensor (see engine/weights.py for the layout).
    FP8 weights stay FP8 and memory-mapped; peak RSS stays near the final footprint."""
    cfg = read_model_config(model_dir, layout)
    store, names, source = open_store(Path(model_dir), layout)
    with store:
        vision = check_names(store, cfg, names, source)
        if vision:
            log.info("%d vision tensors found: the text decoder leaves them to "
                     "engine.vision (loaded when images are served)", vision)
        return assemble(store, cfg, names, progress)
