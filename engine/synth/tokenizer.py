"""The tokenizer files of a synthesized checkpoint, in Ministral-3's format.

``tekken.json`` is a Tekken v13 tokenizer built from mistral-common's own pieces: its
special-token list (``Tekkenizer.DEPRECATED_SPECIAL_TOKENS`` for ids 0-19, then
``[ARGS]`` 32, ``[CALL_ID]`` 33, ``[THINK]`` 34, ``[/THINK]`` 35, the rest filled with
``Tekkenizer.SPECIAL_TOKEN_TEMPLATE``), its file schema (``ModelData``), and the real Tekken
BPE vocabulary it bundles (``tekken_240911.json``), cut to the model's ``vocab_size`` as
mistral-common itself cuts a vocabulary (the first ranks: 256 bytes, then merges in order).
The file is checked by constructing a ``Tekkenizer`` before it is written and reloading it
after (version v13, every named special at its id).

``tokenizer.json`` + ``chat_template.jinja`` (+ ``tokenizer_config.json``), the Hugging Face
pair, are converted from that tekken.json: the vocabulary by transformers' ``MistralConverter``
(needs transformers, a test/bench extra) and the template by mistral-common's
``convert_tokenizer_to_chat_template``. The "published" format writes the same three
files as "both" but with the template the published Ministral-3 Instruct repositories ship
(engine/synth/templates/, Apache-2.0), unchanged.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

FORMATS = ("none", "tekken", "hf", "both", "published")
PUBLISHED_TEMPLATE = (Path(__file__).parent / "templates"
                      / "ministral3-14b-instruct-2512.chat_template.jinja")
REAL_SPECIALS = 1000  # Ministral-3's default_num_special_tokens
SMALL_SPECIALS = 100  # small test vocabularies (mistral-common's own tests use 100)
MIN_VOCAB = 256 + SMALL_SPECIALS  # every byte must have a token
V13_NAMED = {32: "args", 33: "call_id", 34: "begin_think", 35: "end_think"}  # SpecialTokens


def num_special_tokens(vocab_size: int) -> int:
    """1000 (the published count) when the vocabulary leaves room for it, else 100."""
    if vocab_size < MIN_VOCAB:
        raise ValueError(f"a tokenizer needs vocab_size >= {MIN_VOCAB}, got {vocab_size}")
    return REAL_SPECIALS if vocab_size >= REAL_SPECIALS + 4096 else SMALL_SPECIALS


def special_tokens(count: int) -> list[dict[str, Any]]:
    """mistral-common's v13 special-token list, ranks 0..count-1."""
    from mistral_common.tokens.tokenizers.base import SpecialTokens
    from mistral_common.tokens.tokenizers.tekken import SpecialTokenInfo, Tekkenizer

    named = {t["rank"]: str(t["token_str"]) for t in Tekkenizer.DEPRECATED_SPECIAL_TOKENS}
    named.update({rank: SpecialTokens[name].value for rank, name in V13_NAMED.items()})
    return [SpecialTokenInfo(rank=i, is_control=True,
                             token_str=named.get(i, Tekkenizer.SPECIAL_TOKEN_TEMPLATE.format(id=i)))
            for i in range(count)]


def _bundled() -> dict[str, Any]:
    import mistral_common

    path = Path(mistral_common.__file__).parent / "data" / "tekken_240911.json"
    return json.loads(path.read_text(encoding="utf-8"))


def tekken_model(vocab_size: int, image: dict[str, int] | None = None) -> dict[str, Any]:
    """The tekken.json contents (mistral-common's ``ModelData``) for ``vocab_size`` ids."""
    from mistral_common.tokens.tokenizers.tekken import TekkenConfig

    n_special = num_special_tokens(vocab_size)
    src = _bundled()
    vocab = src["vocab"][: vocab_size - n_special]
    config = TekkenConfig(pattern=src["config"]["pattern"], num_vocab_tokens=len(vocab),
                          default_vocab_size=vocab_size, default_num_special_tokens=n_special,
                          version="v13")
    model: dict[str, Any] = {"config": config, "vocab": vocab,
                             "special_tokens": special_tokens(n_special),
                             "version": 1, "type": "Tekken"}
    if image is not None:
        model["image"] = image
    return model


def _check(tok: Any, vocab_size: int) -> None:
    from mistral_common.tokens.tokenizers.base import TokenizerVersion

    if tok.version != TokenizerVersion.v13 or tok.n_words != vocab_size:
        raise ValueError(f"tekken.json: got {tok.version} with {tok.n_words} ids")
    for info in special_tokens(36):
        if tok.get_special_token(info["token_str"]) != info["rank"]:
            raise ValueError(f"tekken.json: {info['token_str']} is not id {info['rank']}")


def write_tekken(out_dir: Path, vocab_size: int, image: dict[str, int] | None = None) -> Path:
    """Write out_dir/tekken.json and check it loads in mistral-common as described."""
    from mistral_common.tokens.tokenizers.base import TokenizerVersion
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    model = tekken_model(vocab_size, image)
    cfg = model["config"]
    _check(Tekkenizer(model["vocab"], model["special_tokens"], cfg["pattern"], vocab_size,
                      cfg["default_num_special_tokens"], TokenizerVersion.v13), vocab_size)
    path = Path(out_dir) / "tekken.json"
    path.write_text(json.dumps(model, ensure_ascii=False), encoding="utf-8")
    _check(Tekkenizer.from_file(path), vocab_size)
    return path


def write_hf_pair(out_dir: Path, tekken: Path, published: bool = False) -> list[str]:
    """tokenizer.json, tokenizer_config.json and chat_template.jinja converted from
    ``tekken`` (``published``: the published 14B Instruct template instead of the
    converted one); returns the file names."""
    try:
        from transformers.integrations.mistral.tokenizer import MistralConverter
    except ImportError as exc:
        raise ValueError("the hf tokenizer files need transformers (pip install "
                         "'fp8serve[test]')") from exc
    from mistral_common.integrations.chat_templates.chat_templates import (
        convert_tokenizer_to_chat_template,
    )

    out = Path(out_dir)
    MistralConverter(vocab_file=str(tekken)).converted().save(str(out / "tokenizer.json"))
    template = (PUBLISHED_TEMPLATE.read_text(encoding="utf-8") if published else
                convert_tokenizer_to_chat_template(tekken, plain_thinking_support=False))
    (out / "chat_template.jinja").write_text(template, encoding="utf-8")
    config = {"bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>",
              "pad_token": "<pad>", "add_bos_token": True, "add_eos_token": False,
              "model_max_length": 1_000_000_000, "tokenizer_class": "TokenizersBackend"}
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
    return ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]


def write_tokenizer_files(out_dir: Path, fmt: str, vocab_size: int,
                          image: dict[str, int] | None = None) -> list[str]:
    """The files of ``fmt`` (one of FORMATS) in out_dir; returns their names."""
    if fmt == "none":
        return []
    if fmt == "tekken":
        write_tekken(out_dir, vocab_size, image)
        return ["tekken.json"]
    if fmt in ("both", "published"):
        tekken = write_tekken(out_dir, vocab_size, image)
        return ["tekken.json", *write_hf_pair(out_dir, tekken, fmt == "published")]
    with tempfile.TemporaryDirectory() as tmp:  # hf only: tekken.json is a build input
        return write_hf_pair(out_dir, write_tekken(Path(tmp), vocab_size, image))
