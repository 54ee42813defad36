"""One message's stream in Anthropic's events: ``message_start``, then per content block
``content_block_start``, its deltas (``thinking_delta``, ``text_delta``,
``input_json_delta``; a thinking block's ``signature_delta`` right before its stop) and
``content_block_stop``, then ``message_delta`` (stop_reason, usage) and ``message_stop``.
Blocks open in the order the output writes them: a change of kind (thinking, text, a new
tool call) closes the open block and opens the next; the non-streamed body has the same
blocks (anthropic.content_blocks)."""

from __future__ import annotations

from typing import Any

from engine.stream import RequestOutput
from service.errors import anthropic_error_body
from service.generation import Event
from service.tool_calls.choice import ChoiceReader
from service.tool_calls.deltas import CallStart, Content, DeltaMessage, Reasoning
from service.translate.anthropic import stop_reason, usage
from service.translate.signature import ThinkingSigner

PING: list[Event] = [("ping", {"type": "ping"})]


class MessageStream:
    def __init__(self, msg_id: str, model: str, reader: ChoiceReader,
                 prompt_tokens: int, signer: ThinkingSigner) -> None:
        self.msg_id, self.model, self.reader = msg_id, model, reader
        self.prompt_tokens, self.signer = prompt_tokens, signer
        self.thought = ""  # the open thinking block's text, for its signature
        self.index = -1
        self.open: tuple[str, int | None] | None = None  # (kind, call index)
        self.calls: dict[int, int] = {}  # call index -> its block's index
        self.output_tokens = self.cached = 0

    def first(self) -> list[Event]:
        msg = {"id": self.msg_id, "type": "message", "role": "assistant",
               "model": self.model, "content": [], "stop_reason": None,
               "stop_sequence": None, "usage": usage(self.prompt_tokens, 0, 0)}
        return [("message_start", {"type": "message_start", "message": msg}), *PING]

    def _block(self, kind: str, call: int | None, block: dict[str, Any]) -> list[Event]:
        if self.open == (kind, call):
            return []
        events = self._close()
        self.index += 1
        self.open = (kind, call)
        return events + [("content_block_start", {"type": "content_block_start",
                                                  "index": self.index,
                                                  "content_block": block})]

    def _close(self) -> list[Event]:
        if self.open is None:
            return []
        kind, _ = self.open
        self.open = None
        events = []
        if kind == "thinking":
            events.append(self._delta({"type": "signature_delta",
                                       "signature": self.signer.sign(self.thought)}))
            self.thought = ""
        return events + [("content_block_stop", {"type": "content_block_stop",
                                                 "index": self.index})]

    def _delta(self, delta: dict[str, Any], index: int | None = None) -> Event:
        return ("content_block_delta", {"type": "content_block_delta",
                                        "index": self.index if index is None else index,
                                        "delta": delta})

    def feed(self, d: DeltaMessage) -> list[Event]:
        events: list[Event] = []
        for e in d.events:
            if isinstance(e, Reasoning):
                events += self._block("thinking", None, {"type": "thinking", "thinking": "",
                                                         "signature": ""})
                events.append(self._delta({"type": "thinking_delta", "thinking": e.text}))
                self.thought += e.text
            elif isinstance(e, Content):
                events += self._block("text", None, {"type": "text", "text": ""})
                events.append(self._delta({"type": "text_delta", "text": e.text}))
            elif isinstance(e, CallStart):
                events += self._block("tool_use", e.index, {
                    "type": "tool_use", "id": e.id, "name": e.name, "input": {}})
                self.calls[e.index] = self.index
            else:
                events.append(self._delta({"type": "input_json_delta",
                                           "partial_json": e.text}, self.calls[e.index]))
        return events

    def chunk(self, out: RequestOutput) -> list[Event]:
        self.output_tokens += len(out.token_ids)
        self.cached = out.num_cached_tokens
        events = self.feed(self.reader.feed(out))
        if not out.finished:
            return events
        reason, sequence = stop_reason(self.reader, out.finish_reason, out.stop_reason)
        use = usage(self.prompt_tokens, self.output_tokens, self.cached)
        return events + self._close() + [
            ("message_delta", {"type": "message_delta",
                               "delta": {"stop_reason": reason, "stop_sequence": sequence},
                               "usage": use}),
            ("message_stop", {"type": "message_stop"})]

    @staticmethod
    def error(status: int, message: str) -> list[Event]:
        return [("error", anthropic_error_body(status, message))]
