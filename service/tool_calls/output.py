"""One output's parser: token ids -> reasoning_content, content and tool calls.

    parser = OutputParser(tokenizer, tool_parser="mistral", reasoning_parser="mistral")
    for step_ids in steps:                      # any number of ids per engine step
        delta = parser.feed(step_ids)           # DeltaMessage (falsy when nothing new)
    delta = parser.finish()                     # the end of the output (EOS, length, stop)

    message = parse_output(tokenizer, ids, tool_parser="hermes")  # ParsedMessage

Ids become pieces (pieces.py), the reasoning parser takes reasoning out, the tool parser
splits the rest into content and calls. Concatenating every delta's content, reasoning and
each call's arguments gives parse_output's message, however the ids are cut into steps.
Without a tool parser, all non-reasoning text is content.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from service.tool_calls.call_ids import new_call_id
from service.tool_calls.deltas import Content, DeltaMessage, Event, ParsedMessage, Reasoning
from service.tool_calls.hermes import HermesToolParser
from service.tool_calls.mistral import MistralToolParser
from service.tool_calls.pieces import Piece, PieceStream, split_pieces
from service.tool_calls.reasoning import MistralReasoningParser, ThinkTagReasoningParser
from service.tool_calls.text_gate import TextGate
from service.tool_calls.vocab import TokenVocab

TOOL_PARSERS = {"mistral": MistralToolParser, "hermes": HermesToolParser}
REASONING_PARSERS = {
    "mistral": MistralReasoningParser,
    "think": ThinkTagReasoningParser,
    # the prompt opened a section (a template's <think>, a prefill): the output starts
    # as reasoning
    "think-open": lambda vocab: ThinkTagReasoningParser(vocab, starts_inside=True),
    "mistral-open": lambda vocab: MistralReasoningParser(vocab, starts_inside=True),
}


class OutputParser:
    def __init__(self, vocab: TokenVocab, tool_parser: str | None = None,
                 reasoning_parser: str | None = None,
                 new_id: Callable[[], str] = new_call_id) -> None:
        for name, table in ((tool_parser, TOOL_PARSERS), (reasoning_parser, REASONING_PARSERS)):
            if name is not None and name not in table:
                raise ValueError(f"unknown parser {name!r}; choose from {', '.join(table)}")
        self._tools = TOOL_PARSERS[tool_parser](vocab, new_id=new_id) if tool_parser else None
        self._reasoning = REASONING_PARSERS[reasoning_parser](vocab) if reasoning_parser else None
        self.structural = frozenset().union(*(p.structural for p in (self._tools,
                                                                     self._reasoning) if p))
        self._stream = PieceStream(vocab, self.structural)
        self._gate = TextGate()
        self._vocab = vocab

    @property
    def in_reasoning(self) -> bool:
        """Whether the output read so far ends inside a reasoning section."""
        return self._reasoning is not None and self._reasoning.inside

    def feed(self, ids: Sequence[int], engine_text: str | None = None) -> DeltaMessage:
        """One engine step's new ids -> what to send now. ``engine_text``: the engine's new
        text for the same step, given when stop strings may cut the output (text_gate.py);
        then every call to feed must pass it."""
        pieces = self._stream.feed(ids)
        if engine_text is not None:
            pieces = self._gate.push(pieces, engine_text)
        return DeltaMessage.of(self._events(pieces, final=False))

    def finish(self) -> DeltaMessage:
        """The output ended: release everything held back (with a gate: what the engine's
        text covers)."""
        pieces = self._stream.finish()
        if self._gate.used:
            pieces = self._gate.push(pieces, "") + self._gate.finish()
        return DeltaMessage.of(self._events(pieces, final=True))

    def parse(self, ids: Sequence[int]) -> ParsedMessage:
        """A whole output at once (use a fresh parser)."""
        pieces = split_pieces(self._vocab, ids, self.structural)
        return ParsedMessage.of(self._events(pieces, final=True))

    def _events(self, pieces: list[Piece], final: bool) -> list[Event]:
        items: list[Piece | Reasoning] = list(pieces)
        if self._reasoning is not None:
            items = self._reasoning.feed(pieces)
            if final:
                items += self._reasoning.finish()
        out: list[Event] = []
        for item in items:
            if isinstance(item, Reasoning):
                out.append(item)
            elif self._tools is not None:
                out += self._tools.feed([item])
            elif isinstance(item, str):
                out.append(Content(item))
        if final and self._tools is not None:
            out += self._tools.finish()
        return out


def parse_output(vocab: TokenVocab, ids: Sequence[int], tool_parser: str | None = None,
                 reasoning_parser: str | None = None,
                 new_id: Callable[[], str] = new_call_id) -> ParsedMessage:
    """Non-streaming: the whole output -> content, reasoning_content, tool_calls."""
    return OutputParser(vocab, tool_parser, reasoning_parser, new_id).parse(ids)
