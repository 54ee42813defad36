"""Random-weight checkpoints in the published Ministral-3 layouts (see checkpoint.py;
spec.py says what to write): ``SynthSpec.preset("tiny")`` ->
``write_checkpoint(out_dir, spec)``."""

from engine.synth.checkpoint import SynthResult, tensor_plan, write_checkpoint
from engine.synth.spec import LAYOUTS, MM_PREFIXES, PRESETS, QUANTS, SynthSpec

__all__ = ["LAYOUTS", "MM_PREFIXES", "PRESETS", "QUANTS", "SynthResult", "SynthSpec",
           "tensor_plan", "write_checkpoint"]
