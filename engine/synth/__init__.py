"""Random-weight checkpoints in the published Ministral-3 layouts (see checkpoint.py):
``SynthSpec.preset("tiny")`` -> ``write_checkpoint(out_dir, spec)``."""

from engine.synth.checkpoint import (
    LAYOUTS,
    MM_PREFIXES,
    PRESETS,
    QUANTS,
    SynthResult,
    SynthSpec,
    tensor_plan,
    write_checkpoint,
)

__all__ = ["LAYOUTS", "MM_PREFIXES", "PRESETS", "QUANTS", "SynthResult", "SynthSpec",
           "tensor_plan", "write_checkpoint"]
