"""Small tokenizer directories written by tests (no downloads)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

CHATML = (
    "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

CORPUS = [
    "Hello, world! The capital of France is Paris.",
    "héllo wörld, naïve café, 日本語のテキスト, emoji 🎉🎉 and 1234567890.",
    "The quick brown fox jumps over the lazy dog. " * 3,
]


def write_bpe_dir(path: Path, chat_template: str | None = CHATML,
                  template_in_config: bool = False) -> Path:
    """A byte-level BPE tokenizer.json trained on CORPUS plus ChatML specials."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<s>"]
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=specials,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(CORPUS, trainer)
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    cfg = {"bos_token": "<s>", "eos_token": {"content": "<|im_end|>"}}
    if chat_template is not None and template_in_config:
        cfg["chat_template"] = [{"name": "tool_use", "template": "TOOLS"},
                                {"name": "default", "template": chat_template}]
    elif chat_template is not None:
        (path / "chat_template.jinja").write_text(chat_template)
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    (path / "generation_config.json").write_text(json.dumps({"eos_token_id": [0, 2]}))
    return path


def write_tekken_dir(path: Path) -> Path:
    import mistral_common

    src = Path(os.path.dirname(mistral_common.__file__)) / "data" / "tekken_240911.json"
    path.mkdir(parents=True, exist_ok=True)
    shutil.copy(src, path / "tekken.json")
    return path
