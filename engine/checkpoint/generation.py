"""Special token ids (bos/eos) from generation_config.json and the model config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from engine.checkpoint.detect import read_json
from engine.checkpoint.errors import CheckpointError

GENERATION_CONFIG = "generation_config.json"


def _as_ids(value: Any, where: str) -> tuple[int, ...]:
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in items):
        raise CheckpointError(f"{where}: eos_token_id must be an int or a list of ints")
    return tuple(items)


def special_ids(
    model_dir: Path, config: dict[str, Any], config_file: str
) -> tuple[int | None, tuple[int, ...]]:
    """(bos, eos ids). generation_config.json first, then the config, then Tekken's 1/2.
    EOS ids from both files are merged (generation_config order first)."""
    gen_path = Path(model_dir) / GENERATION_CONFIG
    gen = read_json(gen_path) if gen_path.exists() else {}
    eos = _as_ids(gen.get("eos_token_id"), GENERATION_CONFIG)
    for extra in _as_ids(config.get("eos_token_id"), config_file):
        if extra not in eos:
            eos = eos + (extra,)
    bos = gen.get("bos_token_id", config.get("bos_token_id", 1))
    return (bos if isinstance(bos, int) else None), (eos or (2,))
