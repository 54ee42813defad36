"""One chat choice's output as OpenAI sends it, streaming or not, through the parsers the
request's plan names. Both modes feed the same engine outputs through the same parser, so a
reassembled stream equals the non-streaming message.

    reader = ChoiceReader(tokenizer, plan, stop_strings=bool(params.stop))
    for out in outputs:                       # engine.stream.RequestOutput, in order
        delta = reader.feed(out)              # DeltaMessage for this step's chunk
    message = reader.message()                # the whole assistant message (non-streaming)
    reader.events                             # everything fed, in output order
    reader.finish_reason(out.finish_reason)   # "tool_calls" when calls were made
    reader.chat_finish_reason(...)            # the same; "stop" for a named tool_choice
"""

from __future__ import annotations

from typing import Any

from engine.request import FinishReason
from engine.stream import RequestOutput
from service.tool_calls.deltas import (
    CallArgs,
    CallStart,
    Content,
    DeltaMessage,
    Event,
    ParsedMessage,
    ToolCall,
)
from service.tool_calls.hermes import CLOSE as HERMES_CLOSE
from service.tool_calls.hermes import OPEN as HERMES_OPEN
from service.tool_calls.output import OutputParser
from service.tool_calls.plan import ChatPlan
from service.tool_calls.reasoning import REASONING_TAGS, STARTS_INSIDE
from service.tool_calls.vocab import TokenVocab


class ReasoningCounter:
    """Output tokens inside the reasoning block: counted on ids when both tags are single
    tokens of the vocabulary, else by encoding the reasoning text at the end."""

    def __init__(self, vocab: Any, parser: str | None) -> None:
        begin, end = REASONING_TAGS.get(parser or "", (None, None))
        lookup = getattr(vocab, "token_to_id", lambda _: None)
        self._begin = lookup(begin) if begin else None
        self._end = lookup(end) if end else None
        self._by_ids = self._begin is not None and self._end is not None
        self._inside = parser in STARTS_INSIDE
        self._vocab = vocab
        self.count = 0

    def feed(self, ids: tuple[int, ...]) -> None:
        if not self._by_ids:
            return
        for t in ids:
            if t in (self._begin, self._end):
                self._inside = t == self._begin
            elif self._inside:
                self.count += 1

    def total(self, reasoning_text: str) -> int:
        if self._by_ids or not reasoning_text:
            return self.count
        return len(self._vocab.encode(reasoning_text, add_special_tokens=False))


class ChoiceReader:
    def __init__(self, vocab: TokenVocab, plan: ChatPlan, stop_strings: bool = False) -> None:
        self.parsing = plan.tool_parser is not None or plan.reasoning_parser is not None
        self._parser = (OutputParser(vocab, plan.tool_parser, plan.reasoning_parser)
                        if self.parsing else None)
        # tool_choice required or a named function: the grammar writes only calls, so text
        # is no content: the whitespace it puts between them ("\n" between Hermes blocks),
        # or what is left of a call max_tokens or a stop cut ("<tool_", "get_weat")
        self._calls_only = (plan.tool_parser is not None and plan.tools is not None
                            and (plan.tool_choice == "required"
                                 or plan.forced_function is not None))
        self._named = plan.tool_parser is not None and plan.forced_function is not None
        # with tools, whitespace-only text is no content where a call follows it: before
        # the first call ("[/THINK]\n\n[TOOL_CALLS]"), between calls and after them
        self._tools = plan.tool_parser is not None and plan.tools is not None
        self._held_space = ""  # whitespace not yet known to be content
        self._seen_call = False
        self._run_text = False  # text other than whitespace went out since the last call
        self._stop_string = False  # a stop string ended the output
        # the parsers' markers written as text (not special tokens): never the message's
        self.text_markers = tuple(
            [*REASONING_TAGS.get(plan.reasoning_parser or "", ()),
             *((HERMES_OPEN, HERMES_CLOSE) if plan.tool_parser == "hermes" else ())])
        self._gated = stop_strings
        self._reasoning = ReasoningCounter(vocab, plan.reasoning_parser)
        self._message = ParsedMessage()
        self.events: list[Event] = []  # every delta's events, in output order

    def feed(self, out: RequestOutput) -> DeltaMessage:
        """This output's delta (with ``out.finished``, everything held back too)."""
        if out.finished:
            self._stop_string = isinstance(out.stop_reason, str)
        if self._parser is None:
            delta = DeltaMessage.of([Content(out.text)])
        else:
            self._reasoning.feed(out.token_ids)
            delta = self._parser.feed(out.token_ids, out.text if self._gated else None)
            if out.finished:
                delta = DeltaMessage.of(delta.events + self._parser.finish().events)
            if self._calls_only:
                delta = DeltaMessage.of([e for e in delta.events
                                         if not isinstance(e, Content)])
            else:
                delta = DeltaMessage.of(self._after_calls(delta.events, out.finished))
        self._record(delta)
        return delta

    def _after_calls(self, events: list[Event], finished: bool) -> list[Event]:
        """``events`` without the whitespace-only text before, between or after calls
        (what a tool grammar writes between Hermes blocks, or after a reasoning section:
        vLLM's content is the text before the first call), the same however the output
        was cut into steps: a run's whitespace is held until text follows it (then both
        go out, and the rest of the run with them) or a call does (then it is dropped);
        at the end it is dropped after a call and goes out as the answer's content where
        no call came."""
        out: list[Event] = []
        for e in events:
            holding = (self._seen_call or self._tools) and not self._run_text
            if isinstance(e, Content) and holding:
                text, self._held_space = self._held_space + e.text, ""
                if text.strip():
                    out.append(Content(text))
                    self._run_text = True
                else:
                    self._held_space = text
                continue
            if isinstance(e, CallStart | CallArgs):
                self._seen_call, self._held_space, self._run_text = True, "", False
            out.append(e)
        if finished:
            if self._held_space and not self._seen_call:
                out.append(Content(self._held_space))
            self._held_space = ""
        return out

    def _record(self, d: DeltaMessage) -> None:
        self.events += d.events
        m = self._message
        m.content += d.content
        m.reasoning_content += d.reasoning_content
        for t in d.tool_calls:
            if t.id is not None:
                m.tool_calls.append(ToolCall(t.id, t.name or "", ""))
            m.tool_calls[t.index].arguments += t.arguments

    @property
    def has_calls(self) -> bool:
        return bool(self._message.tool_calls)

    def message(self) -> dict[str, Any]:
        """The assistant message so far (OpenAI form); without parsers, content as is."""
        if not self.parsing:
            return {"role": "assistant", "content": self._message.content}
        return self._message.to_openai()

    @property
    def in_reasoning(self) -> bool:
        """Whether the output read so far ends inside a reasoning section (a cut one)."""
        return self._parser is not None and self._parser.in_reasoning

    @property
    def reasoning_tokens(self) -> int:
        return self._reasoning.total(self._message.reasoning_content)

    def finish_reason(self, reason: FinishReason | None) -> str | None:
        """``tool_calls`` when the output ended on calls (Anthropic's ``tool_use``); a
        stop string that cut a call's arguments short ends with ``stop``, as vLLM's (the
        call is not one to run)."""
        if reason is FinishReason.STOP and self.has_calls and not (
                self._stop_string and not self._message.tool_calls[-1].arguments_valid):
            return "tool_calls"
        return None if reason is None else reason.value

    def chat_finish_reason(self, reason: FinishReason | None) -> str | None:
        """Chat Completions' finish_reason: as :meth:`finish_reason`, but the call a named
        tool_choice asked for ends with ``stop``, as OpenAI's and vLLM's do (the model
        did not choose to call)."""
        out = self.finish_reason(reason)
        return "stop" if out == "tool_calls" and self._named else out
