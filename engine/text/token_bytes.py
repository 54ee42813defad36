"""A token's own bytes from a tokenizer.json vocabulary (OpenAI's logprobs ``bytes``): a
client joins the bytes of consecutive tokens into the characters they split.

- byte-level BPE (a ``ByteLevel`` decoder): each piece character stands for one byte
  through GPT-2's byte <-> unicode table;
- byte fallback: a ``<0xNN>`` piece is the byte NN;
- metaspace (a ``Metaspace`` decoder, or a ``Replace`` of "▁" by " "): "▁" is a space;
- added tokens (specials such as ``<s>``) are their text in UTF-8.

Tekken vocabularies store bytes themselves (engine/text/tokenizer_tekken.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any

BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


@cache
def byte_level_table() -> dict[str, int]:
    """GPT-2's table, inverted: the printable character that stands for each byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def _decoders(spec: Any) -> Iterator[Mapping[str, Any]]:
    if isinstance(spec, Mapping):
        yield spec
        for inner in spec.get("decoders") or ():
            yield from _decoders(inner)


class PieceBytes:
    """Vocabulary piece -> bytes for one tokenizer.json (its parsed ``decoder`` block)."""

    def __init__(self, decoder: Any) -> None:
        found = list(_decoders(decoder))
        self.byte_level = any(d.get("type") == "ByteLevel" for d in found)
        self.space = None  # the character that stands for a space, if any
        for d in found:
            if d.get("type") == "Metaspace":
                self.space = d.get("replacement", "▁")
            elif d.get("type") == "Replace" and d.get("content") == " ":
                pattern = d.get("pattern") or {}
                self.space = pattern.get("String", self.space)

    def __call__(self, piece: str, added: bool = False) -> bytes:
        if added:
            return piece.encode("utf-8")
        m = BYTE_PIECE.fullmatch(piece)
        if m:
            return bytes([int(m.group(1), 16)])
        if self.byte_level:
            table = byte_level_table()
            if all(c in table for c in piece):
                return bytes(table[c] for c in piece)
        if self.space:
            piece = piece.replace(self.space, " ")
        return piece.encode("utf-8")
