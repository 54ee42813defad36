"""From generation_config.json: special token ids (bos/eos, merged with the model config)
and the sampling defaults a served model applies to fields a request leaves out."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from engine.checkpoint.detect import read_json
from engine.checkpoint.errors import CheckpointError
from engine.sampling_params import SamplingParams, SamplingParamsError

GENERATION_CONFIG = "generation_config.json"


def _as_ids(value: Any, where: str) -> tuple[int, ...]:
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in items):
        raise CheckpointError(f"{where}: eos_token_id must be an int or a list of ints")
    return tuple(items)


def special_ids(
    model_dir: Path, config: dict[str, Any], config_file: str, vocab_size: int | None = None
) -> tuple[int | None, tuple[int, ...]]:
    """(bos, eos ids). generation_config.json first, then the config, then Tekken's 1/2.
    EOS ids from both files are merged (generation_config order first). With
    ``vocab_size``, an id outside [0, vocab_size) raises CheckpointError naming the file
    it came from."""
    gen_path = Path(model_dir) / GENERATION_CONFIG
    gen = read_json(gen_path) if gen_path.exists() else {}
    found = [(i, GENERATION_CONFIG) for i in _as_ids(gen.get("eos_token_id"),
                                                     GENERATION_CONFIG)]
    for extra in _as_ids(config.get("eos_token_id"), config_file):
        if extra not in [i for i, _ in found]:
            found.append((extra, config_file))
    bos_file = GENERATION_CONFIG if "bos_token_id" in gen else config_file
    bos = gen.get("bos_token_id", config.get("bos_token_id", 1))
    bos = bos if isinstance(bos, int) and not isinstance(bos, bool) else None
    checks = [("bos_token_id", bos, bos_file)] if bos is not None else []
    for name, value, where in checks + [("eos_token_id", i, f) for i, f in found]:
        if vocab_size is not None and not 0 <= value < vocab_size:
            raise CheckpointError(f"{where}: {name} {value} is outside the vocabulary "
                                  f"[0, {vocab_size})")
    return bos, (tuple(i for i, _ in found) or (2,))


# generation_config.json key -> request field it gives the default for (vLLM's
# ``--generation-config auto`` set). Only keys present in the file become defaults.
SAMPLING_KEYS = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k",
                 "min_p": "min_p", "repetition_penalty": "repetition_penalty",
                 "max_new_tokens": "max_tokens"}
_INT_FIELDS = frozenset({"top_k", "max_tokens"})


@dataclass(frozen=True)
class SamplingDefaults:
    """Per-model defaults for request fields a client leaves out (None: no default).
    Values are checked like request values when a request uses them."""

    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None
    max_tokens: int | None = None

    def as_dict(self) -> dict[str, float | int]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def sampling_defaults(model_dir: Path) -> SamplingDefaults:
    """The sampling defaults in ``model_dir``/generation_config.json (none if absent).
    A value of the wrong type raises CheckpointError naming the file and key."""
    path = Path(model_dir) / GENERATION_CONFIG
    return defaults_from(read_json(path) if path.exists() else {}, str(path))


def defaults_from(values: dict[str, Any], where: str,
                  base: SamplingDefaults | None = None) -> SamplingDefaults:
    """``base`` (none: no defaults) with the sampling keys of ``values`` (generation_config
    names: max_new_tokens, not max_tokens) set over it; other keys are not sampling
    defaults and are left out. A value a request could not send raises CheckpointError
    naming ``where`` and the key."""
    found: dict[str, float | int] = dict(base.as_dict() if base else {})
    for key, field in SAMPLING_KEYS.items():
        value = values.get(key)
        if value is None:
            continue
        want = int if field in _INT_FIELDS else (int, float)
        if isinstance(value, bool) or not isinstance(value, want):
            kind = "an integer" if field in _INT_FIELDS else "a number"
            raise CheckpointError(f"{where}: {key} must be {kind}, got {value!r}")
        found[field] = value if field in _INT_FIELDS else float(value)
    try:
        SamplingParams(**found)  # the same checks a request's values get
    except SamplingParamsError as exc:
        raise CheckpointError(f"{where}: {exc}") from exc
    return SamplingDefaults(**found)  # type: ignore[arg-type]
