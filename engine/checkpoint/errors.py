"""The one error type a bad checkpoint raises."""

from __future__ import annotations


class CheckpointError(Exception):
    """A checkpoint cannot be loaded. The message is one line that names the file and,
    where one is involved, the tensor, e.g.
    ``model.safetensors: tensor 'model.layers.3.self_attn.q_proj.weight_scale_inv':
    scale is NaN``."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


def tensor_error(file: str, tensor: str, problem: str) -> CheckpointError:
    return CheckpointError(f"{file}: tensor '{tensor}': {problem}")
