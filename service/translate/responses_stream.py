"""A response's output items and typed events (``response.created``, ``.in_progress``,
``.output_item.added``, ``.content_part.added``, ``.output_text.delta`` / ``.done``,
``.reasoning_text.delta`` / ``.done``, ``.function_call_arguments.delta`` / ``.done``,
``.content_part.done``, ``.output_item.done``, ``.completed`` / ``.incomplete``), each
with its
``sequence_number``. One encoder serves both modes: streaming feeds each step's delta;
non-streaming feeds the whole output's events (in output order) as one delta and returns
the last snapshot, so both answers are the same items in the same order.
With ``include: ["message.output_text.logprobs"]``, a message's output_text carries the
entries of the tokens its text is made of (MessageTokens, where parsers split the output);
with ``"reasoning.encrypted_content"``, a reasoning item carries its text sealed
(service/translate/sealed.py) from its ``output_item.done`` on.
``response.completed`` ends a stream, or ``response.incomplete`` when max_output_tokens
cut it (status ``incomplete`` on the response and on the item it cut), as OpenAI's API
ends one (openai-agents reads a cut answer from it, streamed or not)."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

from engine.request import FinishReason
from engine.stream import RequestOutput, TokenLogprob
from service.errors import APIError
from service.sse import Event
from service.tool_calls.choice import ChoiceReader
from service.tool_calls.deltas import CallStart, Content, DeltaMessage, Reasoning
from service.translate.message_tokens import MessageTokens
from service.translate.refusals import in_responses

_PART = {"message": "output_text", "reasoning": "reasoning_text"}


def _new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


class ResponseStream:
    def __init__(self, resp_id: str, head: dict[str, Any], reader: ChoiceReader,
                 prompt_tokens: int, reasoning: bool,
                 entries: Callable[[Sequence[TokenLogprob]], list[dict[str, Any]]] | None = None,
                 on_done: Callable[[dict[str, Any]], None] | None = None,
                 silent: Callable[[int], bool] = lambda _: False,
                 seal: Callable[[str], str] | None = None) -> None:
        """``head``: the request's echoed fields (model, tools, tool_choice, ...).
        ``entries``: the logprob entries of generated tokens (include
        message.output_text.logprobs). Read as plain text, each token is the message's: a
        text delta carries those of the tokens fed since the last one, and the ones left at
        the end (text held back, the end token) go to the message's part. Split by parsers
        (tools, reasoning), a text delta carries those of the tokens its text is made of
        (MessageTokens), and no others are given.
        ``on_done``: called with the finished response (completed or incomplete; not on an
        error or a client that left). ``silent``: a token id whose text the output never
        shows (a special token's). ``seal``: a reasoning item's ``encrypted_content`` of
        its text (include reasoning.encrypted_content), set when the item is done."""
        self.seal = seal
        self.reader, self.prompt_tokens, self.reasoning = reader, prompt_tokens, reasoning
        self.entries, self.on_done = entries, on_done
        self.pending: list[dict[str, Any]] = []  # entries no text delta has carried yet
        # parsers split the output: the message's entries are its text's tokens only
        self.owned = (MessageTokens(silent, reader.text_markers)
                      if entries is not None and reader.parsing else None)
        self.response = {"id": resp_id, "object": "response", "created_at": int(time.time()),
                         "status": "in_progress", "error": None, "incomplete_details": None,
                         **head, "output": [], "usage": None}
        self.seq = 0
        self.open: tuple[str, int | None] | None = None
        self.calls: dict[int, int] = {}  # call index -> its item's output_index
        self.output_tokens = self.cached = 0

    def ev(self, kind: str, **data: Any) -> Event:
        """The next event (its sequence_number is the count of events before it)."""
        self.seq += 1
        return (kind, {"type": kind, "sequence_number": self.seq - 1, **data})

    def first(self) -> list[Event]:
        snap = {**self.response, "output": []}
        return [self.ev("response.created", response=snap),
                self.ev("response.in_progress", response=snap)]

    @property
    def _item(self) -> dict[str, Any]:
        return self.response["output"][-1]

    def _where(self) -> dict[str, Any]:
        return {"item_id": self._item["id"], "output_index": len(self.response["output"]) - 1}

    def _start(self, kind: str, call: int | None, item: dict[str, Any]) -> list[Event]:
        if self.open == (kind, call):
            return []
        events = self._close()
        self.open = (kind, call)
        self.response["output"].append(item)
        events.append(self.ev("response.output_item.added", output_index=len(
            self.response["output"]) - 1, item={**item, "content": []} if "content" in item
            else dict(item)))
        if kind in _PART:
            part = {**item["content"][0], "text": ""}  # as it starts: empty
            if "logprobs" in part:
                part["logprobs"] = []
            events.append(self.ev("response.content_part.added", **self._where(),
                                   content_index=0, part=part))
        return events

    def _close(self, status: str = "completed") -> list[Event]:
        """The open item's done events; ``status`` "incomplete" for the item
        max_output_tokens cut (OpenAI's; the items before it are whole)."""
        if self.open is None:
            return []
        kind, _ = self.open
        self.open = None
        item, where = self._item, self._where()
        item["status"] = status
        events = []
        if kind in _PART:
            part = item["content"][0]
            name = "response.output_text.done" if kind == "message" else \
                "response.reasoning_text.done"
            extra = {"logprobs": list(part["logprobs"])} if kind == "message" else {}
            events += [self.ev(name, **where, content_index=0, text=part["text"], **extra),
                       self.ev("response.content_part.done", **where, content_index=0,
                                part=dict(part))]
            if kind == "reasoning" and self.seal is not None:
                item["encrypted_content"] = self.seal(part["text"])
        else:
            events.append(self.ev("response.function_call_arguments.done", **where,
                                   arguments=item["arguments"]))
        return events + [self.ev("response.output_item.done", output_index=where[
            "output_index"], item=dict(item))]

    def _text(self, kind: str, text: str,
              logprobs: list[dict[str, Any]] | None = None) -> list[Event]:
        part = ({"type": "output_text", "text": "", "annotations": [], "logprobs": []}
                if kind == "message" else {"type": "reasoning_text", "text": ""})
        item = ({"id": _new_id("msg"), "type": "message", "role": "assistant",
                 "status": "in_progress", "content": [part]} if kind == "message" else
                {"id": _new_id("rs"), "type": "reasoning", "summary": [], "content": [part],
                 "status": "in_progress"})
        events = self._start(kind, None, item)
        self._item["content"][0]["text"] += text
        name = ("response.output_text.delta" if kind == "message"
                else "response.reasoning_text.delta")
        extra = {}
        if kind == "message":
            if logprobs is None:
                logprobs, self.pending = self.pending, []
            extra = {"logprobs": logprobs}
            self._item["content"][0]["logprobs"] += logprobs
        return events + [self.ev(name, **self._where(), content_index=0, delta=text,
                                  **extra)]

    def feed(self, d: DeltaMessage) -> list[Event]:
        """Items open in the order the output writes them (reasoning, text, each call)."""
        events: list[Event] = []
        for e in d.events:
            owned = self.owned.take(e) if self.owned is not None else None
            if isinstance(e, (Reasoning, Content)):
                events += self._text("reasoning" if isinstance(e, Reasoning) else "message",
                                     e.text, owned)
            elif isinstance(e, CallStart):
                events += self._start("function_call", e.index, {
                    "id": _new_id("fc"), "type": "function_call", "call_id": e.id,
                    "name": e.name, "arguments": "", "status": "in_progress"})
                self.calls[e.index] = len(self.response["output"]) - 1
            else:
                at = self.calls[e.index]
                item = self.response["output"][at]
                item["arguments"] += e.text
                events.append(self.ev("response.function_call_arguments.delta",
                                       item_id=item["id"], output_index=at, delta=e.text))
        return events

    def interrupt(self) -> None:
        """A run stopped before its end (cancelled, failed): the item it was writing is
        ``incomplete``, as the item max_output_tokens cuts is (a terminal response holds no
        item in progress, and a cut call goes back into a continuation's prompt with its
        complete arguments only: its cut JSON was a 400 on every later turn)."""
        if self.open is not None:
            self.open = None
            self._item["status"] = "incomplete"

    def _cut(self, finish: FinishReason | None) -> bool:
        """Whether max_output_tokens cut the open item: not a reasoning section that was
        closed right before the limit (that item is whole, and no answer began)."""
        if finish is not FinishReason.LENGTH:
            return False
        return self.open is None or self.open[0] != "reasoning" or self.reader.in_reasoning

    def finish(self, finish: FinishReason | None) -> list[Event]:
        messages = [o for o in self.response["output"] if o["type"] == "message"]
        if self.pending and messages:  # before the done events, which carry the part
            messages[-1]["content"][0]["logprobs"] += self.pending
        self.pending = []
        events = self._close("incomplete" if self._cut(finish) else "completed")
        r = self.response
        if finish is FinishReason.LENGTH:
            r["status"], r["incomplete_details"] = "incomplete", {"reason": "max_output_tokens"}
        else:
            r["status"] = "completed"
        reasoning = self.reader.reasoning_tokens if self.reasoning else 0
        r["usage"] = {"input_tokens": self.prompt_tokens,
                      "input_tokens_details": {"cached_tokens": self.cached},
                      "output_tokens": self.output_tokens,
                      "output_tokens_details": {"reasoning_tokens": reasoning},
                      "total_tokens": self.prompt_tokens + self.output_tokens}
        if self.on_done is not None:
            self.on_done(r)
        return events + [self.ev(f"response.{r['status']}", response=r)]

    def _entries(self, lps: Sequence[TokenLogprob]) -> None:
        assert self.entries is not None
        entries = self.entries(lps)
        if self.owned is not None:
            self.owned.add([lp.token_id for lp in lps], entries)
        else:
            self.pending += entries

    def chunk(self, out: RequestOutput) -> list[Event]:
        self.output_tokens += len(out.token_ids)
        self.cached = out.num_cached_tokens
        if self.entries is not None:
            self._entries(out.logprobs)
        events = self.feed(self.reader.feed(out))
        return events + self.finish(out.finish_reason) if out.finished else events

    def whole(self, finish: FinishReason | None, output_tokens: int, cached: int,
              logprobs: Sequence[TokenLogprob] = ()) -> dict[str, Any]:
        """The non-streaming body, from a reader fed the whole output (``logprobs``: its
        tokens', when ``entries`` was given)."""
        self.output_tokens, self.cached = output_tokens, cached
        if self.entries is not None:
            self._entries(logprobs)
        self.feed(DeltaMessage.of(self.reader.events))
        self.finish(finish)
        return self.response

    def error(self, exc: APIError) -> list[Event]:
        """The stream's last event: the code, message and field the whole answer's error
        has (end_code; a grammar's dead end names the Responses field, in_responses)."""
        exc = in_responses(exc)
        return [self.ev("error", code=exc.code, message=exc.message, param=exc.param)]
