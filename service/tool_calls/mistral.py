"""Mistral tool calls, parsed on token ids (pieces: service/tool_calls/pieces.py).

Wire forms (mistral-common ``tokens/tokenizers/instruct.py``), all accepted by one parser:

- v13 (Ministral-3): ``[TOOL_CALLS]name[ARGS]{json}`` per call; a call's arguments run to
  the next ``[TOOL_CALLS]`` or ``</s>``.
- v11: ``[TOOL_CALLS]name[CALL_ID]id[ARGS]{json}``; a 9-character alphanumeric id is kept
  (unless an earlier call of the answer has it: ids are unique in an answer).
- v3-v7: ``[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]``, recognised when the text
  after ``[TOOL_CALLS]`` starts with ``[`` or ``{``; each call is delivered when its object
  closes.

Ids before the first ``[TOOL_CALLS]`` are content. ``[v13]`` arguments stream as they are
decoded. Special tokens are looked up by name in the tokenizer; ``[ARGS]`` and ``[CALL_ID]``
may be absent (v3-v7 tokenizers), ``[TOOL_CALLS]`` may not.

Malformed output (chosen so a client never loses text, and streaming and non-streaming
agree):

- a name that is empty or not ``[A-Za-z0-9_.-]{1,64}`` at ``[ARGS]``: no call; the name and
  the arguments text become content;
- a name with no ``[ARGS]`` (the next ``[TOOL_CALLS]``, ``</s>`` or the end comes first, as
  where ``max_tokens`` or a stop string cuts ``[TOOL_CALLS]get_wea``): no call, and no
  content: text that reads as a name (and a ``[CALL_ID]`` id) is the start of a call, never
  the answer's text, as vLLM drops it; other text there (``[TOOL_CALLS]I cannot``) is
  content;
- arguments that are not valid JSON, or cut by ``</s>``/the end: the call is returned with
  the arguments exactly as generated (``ToolCall.arguments_valid`` tells), as vLLM does: the
  fragments were already streamed;
- v3-v7: an element that is not a JSON object with a valid name, an object that never
  closes, or stray text outside the list: that raw text becomes content.

Anything after ``</s>`` is ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from service.tool_calls.call_ids import AnswerIds, new_call_id
from service.tool_calls.call_json import call_events, valid_name
from service.tool_calls.deltas import CallArgs, CallStart, Content, Event
from service.tool_calls.json_list import JsonListScanner
from service.tool_calls.pieces import Piece
from service.tool_calls.vocab import TokenVocab, special_id


class MistralToolParser:
    """One output's tool calls. feed(pieces) -> events; finish() at the end of the output."""

    def __init__(self, vocab: TokenVocab, new_id: Callable[[], str] = new_call_id) -> None:
        self.tool_calls = special_id(vocab, "[TOOL_CALLS]")
        self.args = special_id(vocab, "[ARGS]", required=False)
        self.call_id = special_id(vocab, "[CALL_ID]", required=False)
        self.eos = special_id(vocab, "</s>", required=False)
        self.structural = frozenset(i for i in (self.tool_calls, self.args, self.call_id,
                                                self.eos) if i is not None)
        self._new_id = AnswerIds(new_id)
        self._state = "content"  # content | name | call_id | args | json | done
        self._name = ""  # raw name text
        self._id = ""  # raw [CALL_ID] text
        self._index: int | None = None  # the open call (None: its arguments are content)
        self._count = 0
        self._json = JsonListScanner()

    def feed(self, pieces: Sequence[Piece]) -> list[Event]:
        out: list[Event] = []
        for p in pieces:
            if self._state == "done":
                break
            if isinstance(p, str):
                self._text(p, out)
            else:
                self._special(p, out)
        return out

    def finish(self) -> list[Event]:
        out: list[Event] = []
        self._close(out)
        self._state = "done"
        return out

    def _text(self, text: str, out: list[Event]) -> None:
        state = self._state
        if state == "content":
            out.append(Content(text))
        elif state == "name":
            self._name += text
            if self._name.lstrip()[:1] in ("[", "{"):
                self._state, raw, self._name = "json", self._name, ""
                self._json_items(self._json.feed(raw), out)
        elif state == "call_id":
            self._id += text
        elif state == "args":
            out.append(Content(text) if self._index is None else CallArgs(self._index, text))
        elif state == "json":
            self._json_items(self._json.feed(text), out)

    def _special(self, tid: int, out: list[Event]) -> None:
        if tid == self.eos:
            out += self.finish()
        elif tid == self.tool_calls:
            self._close(out)
            self._state, self._name, self._id = "name", "", ""
        elif tid == self.call_id and self._state == "name":
            self._state = "call_id"
        elif tid == self.args and self._state in ("name", "call_id"):
            self._open(out)

    def _open(self, out: list[Event]) -> None:
        name, given = self._name.strip(), self._id.strip()
        self._state = "args"
        if not valid_name(name):
            self._index = None
            if self._name + self._id:
                out.append(Content(self._name + self._id))
            return
        self._index, self._count = self._count, self._count + 1
        out.append(CallStart(self._index, self._new_id(given), name))

    def _close(self, out: list[Event]) -> None:
        """The current segment ends (next [TOOL_CALLS], </s> or the end of the output)."""
        if self._state in ("name", "call_id") and not self._call_start():
            out.append(Content(self._name + self._id))
        elif self._state == "json":
            self._json_items(self._json.finish(), out)

    def _call_start(self) -> bool:
        """Whether the text after ``[TOOL_CALLS]`` is a call's start: nothing, a name (whole
        or cut) and, after ``[CALL_ID]``, an alphanumeric id (whole or cut)."""
        name, given = self._name.strip(), self._id.strip()
        id_so_far = not given or (given.isascii() and given.isalnum())
        return (not name or valid_name(name)) and id_so_far

    def _json_items(self, items: list[tuple[str, str]], out: list[Event]) -> None:
        for kind, raw in items:
            events = call_events(raw, self._count, self._new_id) if kind == "object" else None
            if events is None:
                out.append(Content(raw))
            else:
                out += events
                self._count += 1
