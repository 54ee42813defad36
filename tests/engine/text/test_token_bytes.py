"""Tokenizer.token_bytes: a token's own bytes, for byte-level BPE (the published file set's
tokenizer.json), ``<0xNN>`` byte-fallback pieces with metaspace, and Tekken. A character
split over two or three tokens: each token holds a part of it, and their bytes joined
are the character (what a client does with OpenAI's logprobs ``bytes``)."""

from __future__ import annotations

import json

import pytest

from engine.synth import SynthSpec, write_checkpoint
from engine.text.token_bytes import PieceBytes, byte_level_table
from engine.text.tokenizer import Tokenizer
from tests.engine.text.tokenizer_fixtures import write_bpe_dir

SPLIT = {"ж": 2, "€": 3}  # UTF-8 lengths; neither is a whole token in these vocabularies


def _fallback_dir(path):
    """A sentencepiece-style BPE: metaspace words, <0xNN> pieces for bytes without a piece."""
    from tokenizers import Tokenizer as Hf
    from tokenizers import decoders, models, pre_tokenizers

    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
    vocab.update({f"<0x{b:02X}>": 3 + b for b in range(256)})
    for piece in ("▁", "a", "b", "c", "é", "▁a", "▁ab"):
        vocab[piece] = len(vocab)
    tok = Hf(models.BPE(vocab, [("▁", "a"), ("▁a", "b")], unk_token="<unk>",
                        byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    tok.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    tok.add_special_tokens(["<s>", "</s>"])
    path.mkdir(parents=True, exist_ok=True)
    tok.save(str(path / "tokenizer.json"))
    return path


@pytest.fixture(scope="module", params=["byte-level", "published", "byte-fallback", "tekken"])
def tok(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    if request.param == "byte-level":
        write_bpe_dir(d)
    elif request.param == "byte-fallback":
        _fallback_dir(d)
    else:
        write_checkpoint(d, SynthSpec.preset("tiny", tokenizer=request.param))
    t = Tokenizer.from_dir(d)
    assert type(t.backend).__name__ == ("TekkenBackend" if request.param == "tekken"
                                        else "HfBackend")
    return t


@pytest.mark.parametrize("char", list(SPLIT))
def test_a_split_character_joins_from_its_tokens(tok, char):
    ids = tok.encode(f"ab{char}", add_special_tokens=False)
    pieces = [tok.token_bytes(i) for i in ids]
    assert b"".join(pieces).endswith(char.encode("utf-8"))
    tail = pieces[-SPLIT[char]:]
    assert [len(p) for p in tail] == [1] * SPLIT[char]  # one token per byte
    for p in tail:  # each alone is part of a character, not text
        with pytest.raises(UnicodeDecodeError):
            p.decode("utf-8")
        assert tok.token_to_text(ids[pieces.index(p)]) == "\ufffd"


def test_token_bytes_join_into_the_text(tok):
    text = "Paris, café ж€ 123"
    ids = tok.encode(text, add_special_tokens=False)
    joined = b"".join(tok.token_bytes(i) for i in ids).decode("utf-8")
    lead = " " if type(tok.backend).__name__ == "HfBackend" and "▁" in str(
        tok.id_to_token(ids[0])) else ""  # metaspace writes the first word's space
    assert joined == lead + text
    bos = tok.bos_token_id if tok.bos_token_id is not None else tok.token_to_id("<s>")
    assert tok.token_bytes(bos) == b"<s>"  # a special token: its text


def test_piece_bytes_rules():
    table = byte_level_table()
    assert len(table) == 256 and sorted(table.values()) == list(range(256))
    assert table["Ġ"] == 0x20 and table["!"] == 0x21
    byte_level = PieceBytes({"type": "ByteLevel"})
    assert byte_level("ĠParis") == b" Paris" and byte_level("<0xE2>") == b"\xe2"
    meta = PieceBytes(json.loads('{"type": "Metaspace", "replacement": "▁"}'))
    assert meta("▁Paris") == b" Paris" and meta("<0x0A>") == b"\n"
    assert meta("<s>", added=True) == b"<s>"
