"""The vision tower's MLP activation (``vision_config.hidden_act``), by the names
transformers' ACT2FN gives them: Pixtral runs ``down(act(gate(x)) * up(x))`` with any of
them (its config defaults to "gelu"; the published Ministral-3 files say "silu").

    activation("gelu")(gate) -> act(gate), same shape and dtype, computed in place

Names outside ACTIVATIONS raise ValueError: the caller names the way to serve the text
model without images (engine/vision/config.py)."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

Activation = Callable[[torch.Tensor], torch.Tensor]


def _gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    return x.copy_(F.gelu(x, approximate="tanh"))


def _quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x.mul_(torch.sigmoid(1.702 * x))


ACTIVATIONS: dict[str, Activation] = {
    "silu": lambda x: F.silu(x, inplace=True),
    "swish": lambda x: F.silu(x, inplace=True),
    "gelu": lambda x: x.copy_(F.gelu(x)),  # exact (erf)
    "gelu_pytorch_tanh": _gelu_tanh,
    "gelu_new": _gelu_tanh,  # the same tanh formula
    "gelu_fast": _gelu_tanh,
    "quick_gelu": _quick_gelu,
    "relu": lambda x: F.relu(x, inplace=True),
}


def activation(name: str) -> Activation:
    """The in-place activation for ``name``; ValueError for one not served."""
    try:
        return ACTIVATIONS[name]
    except KeyError:
        raise ValueError(f"hidden_act {name!r} is not served (served: "
                         f"{', '.join(ACTIVATIONS)})") from None
