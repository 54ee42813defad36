"""Which checkpoint layout a directory holds, decided from its files alone."""

from __future__ import annotations

import enum
import json
from pathlib import Path
from typing import Any

from engine.checkpoint.errors import CheckpointError

HF_CONFIG = "config.json"
NATIVE_PARAMS = "params.json"
NATIVE_WEIGHTS = "consolidated.safetensors"
HF_SINGLE = "model.safetensors"
HF_INDEX = "model.safetensors.index.json"


class Layout(str, enum.Enum):
    HF = "hf"  # config.json + model.safetensors (or shards + index)
    NATIVE = "native"  # params.json + consolidated.safetensors


def detect_layout(model_dir: Path, want: Layout | str | None = None) -> Layout:
    """HF wins when config.json and HF weights exist (published repos ship both), unless
    ``want`` names the layout to read (the operator's choice: vLLM's --config-format /
    --load-format); then its files must be there."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise CheckpointError(f"{model_dir}: not a directory")
    has_hf_weights = (model_dir / HF_SINGLE).exists() or (model_dir / HF_INDEX).exists()
    if want is not None and Layout(want) is Layout.NATIVE:
        for name in (NATIVE_PARAMS, NATIVE_WEIGHTS):
            if not (model_dir / name).exists():
                raise CheckpointError(f"{model_dir / name}: missing (the Mistral-native "
                                      "layout was asked for)")
        return Layout.NATIVE
    if want is not None and not (model_dir / HF_CONFIG).exists():
        raise CheckpointError(f"{model_dir / HF_CONFIG}: missing (the Hugging Face layout "
                              "was asked for)")
    if (model_dir / HF_CONFIG).exists() and has_hf_weights:
        return Layout.HF
    if (model_dir / NATIVE_PARAMS).exists() and (model_dir / NATIVE_WEIGHTS).exists():
        return Layout.NATIVE
    if (model_dir / HF_CONFIG).exists():
        raise CheckpointError(
            f"{model_dir / HF_SINGLE}: missing (config.json found, but neither "
            f"{HF_SINGLE} nor {HF_INDEX})"
        )
    if (model_dir / NATIVE_PARAMS).exists():
        raise CheckpointError(f"{model_dir / NATIVE_WEIGHTS}: missing (params.json found)")
    raise CheckpointError(
        f"{model_dir / HF_CONFIG}: missing config (no {HF_CONFIG} or {NATIVE_PARAMS} "
        f"in {model_dir})"
    )


def read_json(path: Path) -> dict[str, Any]:
    """Parse a JSON object file; CheckpointError naming the file if it is not one."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{path}: missing") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(f"{path}: not valid JSON ({exc})") from None
    if not isinstance(data, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return data
