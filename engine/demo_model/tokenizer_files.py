"""tokenizer.json, tokenizer_config.json, chat_template.jinja and generation_config.json
built from a gpt2-type GGUF vocabulary.

The GGUF stores byte-level BPE tokens already spelled in GPT-2's byte alphabet, plus the
merges. llama.cpp's ``smollm`` pre-tokenizer splits every digit on its own and then applies
the GPT-2 regex; in tokenizers' terms that is Digits(individual) followed by
ByteLevel(use_regex=True), exactly SmolLM2's published tokenizer.json. Tokens typed CONTROL
(3) become special added tokens, USER_DEFINED (4) plain added tokens.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from engine.demo_model.gguf_source import GgufModel

CONTROL, USER_DEFINED = 3, 4


def build_tokenizer(meta: GgufModel):
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

    vocab = {tok: i for i, tok in enumerate(meta.tokens)}
    merges = [tuple(m.split(" ", 1)) for m in meta.merges]
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
    splits = [pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)]
    if meta.pre_tokenizer in ("smollm", "starcoder", "refact", "codeshell"):
        splits.insert(0, pre_tokenizers.Digits(individual_digits=True))
    tok.pre_tokenizer = pre_tokenizers.Sequence(splits)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    special = [AddedToken(t, special=True, normalized=False)
               for t, k in zip(meta.tokens, meta.token_types, strict=True) if k == CONTROL]
    plain = [AddedToken(t, special=False, normalized=False)
             for t, k in zip(meta.tokens, meta.token_types, strict=True) if k == USER_DEFINED]
    tok.add_special_tokens(special)
    if plain:
        tok.add_tokens(plain)
    return tok


CHATML_TOOLS = Path(__file__).with_name("templates") / "chatml_tools.jinja"
_CHATML_DEFAULT_SYSTEM = re.compile(r"<\|im_start\|>system\n(.*?)<\|im_end\|>", re.S)


def chat_template(meta: GgufModel) -> str:
    """The GGUF's template, except that a ChatML template without tool support becomes
    templates/chatml_tools.jinja (Hermes-style tools) with the same default system
    message: tool-less conversations render the same text."""
    source = meta.chat_template
    if "<|im_start|>" not in source or "tools" in source:
        return source
    found = _CHATML_DEFAULT_SYSTEM.search(source)
    default = "none" if found is None else json.dumps(found.group(1))
    return (f"{{%- set default_system_message = {default} -%}}\n"
            + CHATML_TOOLS.read_text(encoding="utf-8"))


def write_tokenizer_files(meta: GgufModel, out_dir: Path) -> None:
    build_tokenizer(meta).save(str(out_dir / "tokenizer.json"))
    (out_dir / "chat_template.jinja").write_text(chat_template(meta), encoding="utf-8")
    text = meta.tokens
    cfg = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": text[meta.bos_token_id],
        "eos_token": text[meta.eos_token_id],
        "unk_token": text[0],
        "pad_token": text[meta.pad_token_id] if meta.pad_token_id is not None else None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": meta.context_length,
    }
    (out_dir / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    eos = sorted({meta.eos_token_id, *turn_end_ids(meta)})
    gen = {"bos_token_id": meta.bos_token_id, "eos_token_id": eos,
           "pad_token_id": meta.pad_token_id, "do_sample": False}
    (out_dir / "generation_config.json").write_text(json.dumps(gen, indent=2))


def turn_end_ids(meta: GgufModel) -> list[int]:
    """Special tokens the chat template closes a turn with (``<|im_end|>`` for ChatML)."""
    ids = []
    for marker in ("<|im_end|>", "<|eot_id|>", "<end_of_turn>", "</s>"):
        if marker in meta.chat_template and marker in meta.tokens:
            ids.append(meta.tokens.index(marker))
    return ids
