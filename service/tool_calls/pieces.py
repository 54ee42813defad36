"""Token ids -> pieces: the structural special tokens a parser acts on (kept as their int
ids) and the text between them (str). Other special tokens decode to nothing.

``PieceStream`` does it incrementally, one engine step at a time, with engine.text.detokenizer's
IncrementalDetokenizer (a new one after each structural token, so text never spans one);
``split_pieces`` decodes a finished output at once. Both give the same text between
structural tokens; only how it is chunked differs.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from engine.text.detokenizer import IncrementalDetokenizer
from service.tool_calls.vocab import TokenVocab

Piece = int | str


def split_pieces(vocab: TokenVocab, ids: Sequence[int], structural: Collection[int]) -> list[Piece]:
    out: list[Piece] = []
    run: list[int] = []
    for i in [*ids, None]:
        if i is not None and i not in structural:
            run.append(i)
            continue
        if run and (text := vocab.decode(run, skip_special_tokens=True)):
            out.append(text)
        run = []
        if i is not None:
            out.append(i)
    return out


class PieceStream:
    """One output's ids -> pieces, fed step by step; finish() releases held-back text."""

    def __init__(self, vocab: TokenVocab, structural: Collection[int]) -> None:
        self._vocab = vocab
        self._structural = frozenset(structural)
        self._detok = self._new()

    def _new(self) -> IncrementalDetokenizer:
        return IncrementalDetokenizer(self._vocab, [], skip_special_tokens=True)

    def feed(self, ids: Sequence[int]) -> list[Piece]:
        out: list[Piece] = []
        for i in ids:
            if i in self._structural:
                out += self.finish()
                out.append(i)
            elif text := self._detok.push(i).new_text:
                out.append(text)
        return out

    def finish(self) -> list[Piece]:
        tail = self._detok.flush()
        self._detok = self._new()
        return [tail] if tail else []
