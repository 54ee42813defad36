"""The demo model with ``<think>`` / ``</think>`` as single tokens of its vocabulary (added
tokens, special or not, as reasoning checkpoints ship them) and a chat template that
mentions ``<think>`` (the ``think`` reasoning parser): two unused added tokens of the demo
tokenizer take those names; the weights are the demo model's (linked, not copied)."""

from __future__ import annotations

import json
from pathlib import Path

from engine.demo_model import ensure_demo_model

# the demo tokenizer's added tokens that become <think> / </think>
THINK_IDS = {11: "<think>", 12: "</think>"}


def think_model_dir(dest: Path, special: bool) -> Path:
    """``dest`` as the demo model whose ``<think>`` / ``</think>`` are added tokens
    (``special``: marked special, so decoding skips them)."""
    src = ensure_demo_model()
    dest.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name not in ("tokenizer.json", "chat_template.jinja"):
            (dest / f.name).symlink_to(f)
    tj = json.loads((src / "tokenizer.json").read_text())
    vocab = tj["model"]["vocab"]
    for added in tj["added_tokens"]:
        new = THINK_IDS.get(added["id"])
        if new is not None:
            del vocab[added["content"]]
            vocab[new] = added["id"]
            added.update(content=new, special=special)
    (dest / "tokenizer.json").write_text(json.dumps(tj, ensure_ascii=False))
    template = (src / "chat_template.jinja").read_text()
    (dest / "chat_template.jinja").write_text("{#- reasoning in <think> tags -#}\n" + template)
    return dest
