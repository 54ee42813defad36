"""One message's stream in Anthropic's events: ``message_start``, then per content block
``content_block_start``, its deltas (``thinking_delta``, ``text_delta``,
``input_json_delta``; a thinking block's ``signature_delta`` right before its stop; with
thinking.display "omitted" a thinking block has no text, only the signature of "") and
``content_block_stop``, then ``message_delta`` (stop_reason, usage) and ``message_stop``.
Blocks open in the order the output writes them: a change of kind (thinking, text, a new
tool call) closes the open block and opens the next. The encoder keeps the blocks its
events build (``content``, as the SDK's accumulator builds them); the non-streamed body
(``whole``) is that snapshot after the whole output's events, so both modes give one
message. A tool_use block's ``input_json_delta`` text reads, accumulated, as a JSON object
after every delta (call_json.object_prefix: the SDK's accumulator parses it there and
raises where it does not): whitespace before the object waits for it, and arguments that
are no JSON end with their longest prefix that is, in both modes."""

from __future__ import annotations

from typing import Any

from engine.stream import RequestOutput
from service.collect import Choice
from service.errors import APIError, anthropic_error_body
from service.sse import Event
from service.tool_calls.call_json import object_prefix
from service.tool_calls.choice import ChoiceReader
from service.tool_calls.deltas import CallStart, Content, DeltaMessage, Reasoning
from service.translate.anthropic import stop_reason, tool_input, usage
from service.translate.refusals import in_messages
from service.translate.signature import ThinkingSigner

PING: list[Event] = [("ping", {"type": "ping"})]


class MessageStream:
    def __init__(self, msg_id: str, model: str, reader: ChoiceReader,
                 prompt_tokens: int, signer: ThinkingSigner, omit_thinking: bool = False,
                 max_tokens: int | None = None) -> None:
        self.msg_id, self.model, self.reader = msg_id, model, reader
        self.prompt_tokens, self.signer = prompt_tokens, signer
        self.omit_thinking = omit_thinking  # thinking.display "omitted": blocks without text
        self.thought = ""  # the open thinking block's text, for its signature
        self.index = -1
        self.open: tuple[str, int | None] | None = None  # (kind, call index)
        self.calls: dict[int, int] = {}  # call index -> its block's index
        self.content: list[dict[str, Any]] = []  # the blocks the events so far build
        self.arguments: dict[int, str] = {}  # a tool_use block's index -> its JSON text
        self.held: dict[int, str] = {}  # a tool_use block's text no delta may carry yet
        self.output_tokens = self.cached = 0
        self.max_tokens = max_tokens  # asked: a length stop short of it is the window's

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
        self.content.append(dict(block))
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
        index = self.index if index is None else index
        block, kind = self.content[index], delta["type"]
        if kind == "input_json_delta":
            self.arguments[index] = self.arguments.get(index, "") + delta["partial_json"]
        elif kind == "signature_delta":
            block["signature"] = delta["signature"]
        else:  # thinking_delta, text_delta
            field = kind.removesuffix("_delta")
            block[field] += delta[field]
        return ("content_block_delta", {"type": "content_block_delta", "index": index,
                                        "delta": delta})

    def feed(self, d: DeltaMessage) -> list[Event]:
        events: list[Event] = []
        for e in d.events:
            if isinstance(e, Reasoning):
                events += self._block("thinking", None, {"type": "thinking", "thinking": "",
                                                         "signature": ""})
                if not self.omit_thinking:
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
                index, held = self.calls[e.index], self.held.get(self.calls[e.index], "")
                if held.strip():  # text that stopped reading as an object: none can follow
                    continue
                text, self.held[index] = object_prefix(self.arguments.get(index, ""),
                                                       held + e.text)
                if text:
                    events.append(self._delta({"type": "input_json_delta",
                                               "partial_json": text}, index))
        return events

    def chunk(self, out: RequestOutput) -> list[Event]:
        self.output_tokens += len(out.token_ids)
        self.cached = out.num_cached_tokens
        events = self.feed(self.reader.feed(out))
        if not out.finished:
            return events
        reason, sequence = stop_reason(self.reader, out.finish_reason, out.stop_reason,
                                       self._window(self.output_tokens))
        use = usage(self.prompt_tokens, self.output_tokens, self.cached)
        return events + self._close() + [
            ("message_delta", {"type": "message_delta",
                               "delta": {"stop_reason": reason, "stop_sequence": sequence},
                               "usage": use}),
            ("message_stop", {"type": "message_stop"})]

    def whole(self, choice: Choice) -> dict[str, Any]:
        """The non-streaming body, from a reader fed the whole output: the blocks its
        events build, each tool_use's input parsed from its arguments."""
        self.feed(DeltaMessage.of(self.reader.events))
        self._close()
        for index, text in self.arguments.items():
            self.content[index]["input"] = tool_input(text)
        reason, sequence = stop_reason(self.reader, choice.finish_reason, choice.stop_reason,
                                       self._window(len(choice.token_ids)))
        return {"id": self.msg_id, "type": "message", "role": "assistant", "model": self.model,
                "content": self.content, "stop_reason": reason, "stop_sequence": sequence,
                "usage": usage(self.prompt_tokens, len(choice.token_ids),
                               choice.num_cached_tokens)}

    def _window(self, output_tokens: int) -> bool:
        """Whether a length stop after ``output_tokens`` was the context window's: fewer
        than max_tokens asked for."""
        return self.max_tokens is not None and output_tokens < self.max_tokens

    @staticmethod
    def error(exc: APIError) -> list[Event]:
        """The stream's last event: the whole answer's error (a grammar's dead end names
        the Messages field, in_messages)."""
        exc = in_messages(exc)
        return [("error", anthropic_error_body(exc.status, exc.message))]
