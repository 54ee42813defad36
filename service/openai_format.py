"""Engine outputs -> OpenAI response / stream-chunk dicts (completions and chat)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from engine.request import FinishReason
from engine.stream import TokenLogprob
from service.collect import Choice
from service.logprob_format import (
    TokenBytes,
    TokenText,
    chat_logprobs,
    completion_logprobs,
    echo_logprobs,
    prompt_logprobs,
    text_offsets,
    top_cut,
)
from service.tool_calls.choice import ChoiceReader


def finish_reason(reason: FinishReason | None) -> str | None:
    return None if reason is None else reason.value


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0,
          details: dict[str, int] | None = None) -> dict[str, Any]:
    """OpenAI's usage object; ``cached_tokens``: prompt tokens whose KV came from the
    prefix cache (``prompt_tokens_details``, as OpenAI and vLLM report it); ``details``:
    ``completion_tokens_details`` (service/chat_run.py ChatRun.details: reasoning tokens,
    accepted / rejected prediction tokens), left out when None."""
    body = {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}
    if details is not None:
        body["completion_tokens_details"] = details
    return body


def choices_usage(choices: Sequence[Choice], n: int) -> dict[str, Any]:
    """Prompt tokens (and their cached part) are counted once per prompt: the first of
    its n choices (choices come in groups of n)."""
    firsts = choices[::n]
    return usage(sum(c.num_prompt_tokens for c in firsts),
                 sum(len(c.token_ids) for c in choices),
                 sum(c.num_cached_tokens for c in firsts))


class Formatter:
    """Builds bodies for one HTTP request (fixed id, created time and model name)."""

    def __init__(self, rid: str, model: str, text_of: TokenText,
                 bytes_of: TokenBytes | None = None,
                 decoded_of: TokenText | None = None,
                 own_bytes: TokenBytes | None = None,
                 shown_of: TokenText | None = None,
                 special: Callable[[int], bool] | None = None,
                 fingerprint: str | None = None, null_usage: bool = False) -> None:
        """``text_of`` / ``bytes_of`` name tokens in logprobs; ``decoded_of`` (default
        ``text_of``) is each token's text: prompt_logprobs' decoded_token and what
        text_offset counts, with ``own_bytes`` (default ``bytes_of``), each token's own
        bytes, for the tokens that split a character (text_offsets); ``shown_of``
        (default ``decoded_of``) is a generated token's text as the answer shows it (a
        special token's is empty where skip_special_tokens leaves it out); ``special``
        tells the special tokens (an echoed prompt's offsets: text_offsets).
        ``fingerprint``: every body's system_fingerprint (service/fingerprint.py).
        ``null_usage`` (a stream with include_usage): every chunk has a usage field, null
        but on the usage chunk (OpenAI's stream; vLLM's too)."""
        self.special = special
        self.id, self.model, self.text_of, self.bytes_of = rid, model, text_of, bytes_of
        self.decoded_of = text_of if decoded_of is None else decoded_of
        self.shown_of = self.decoded_of if shown_of is None else shown_of
        self.own_bytes = bytes_of if own_bytes is None else own_bytes
        self.created = int(time.time())
        self.fingerprint = fingerprint
        self.null_usage = null_usage

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": self.fingerprint}

    def _chunk(self, obj: str, choice: dict[str, Any]) -> dict[str, Any]:
        """A stream chunk of one choice (usage: null with null_usage)."""
        return {**self._head(obj), "choices": [choice],
                **({"usage": None} if self.null_usage else {})}

    def completion(self, choices: Sequence[Choice], n: int, echo: Sequence[str],
                   logprobs: int | None, prompt_ids: Sequence[Sequence[int]] = (),
                   token_ids: bool = False, prompt_k: int | None = None) -> dict[str, Any]:
        """``echo``: each prompt's text (empty: no echo); with ``logprobs`` (top-k),
        ``prompt_ids`` gives each prompt's tokens and each choice carries its prompt
        logprobs. ``token_ids`` (vLLM's return_token_ids): each choice carries its prompt's
        ids and its own. ``prompt_k`` (vLLM's prompt_logprobs): each choice carries them."""
        out = []
        for i, c in enumerate(choices):
            prefix = echo[i // n] if echo else ""
            out.append({"index": i, "text": prefix + "".join(c.text),
                        "logprobs": self.completion_logprobs(
                            c.logprobs, len(prefix),
                            prompt_ids[i // n] if echo and prompt_ids else None,
                            top_cut(c.prompt_logprobs, logprobs), echo_text=prefix)
                        if logprobs is not None else None,
                        "finish_reason": finish_reason(c.finish_reason),
                        "stop_reason": c.stop_reason})
            if prompt_k is not None:
                out[-1]["prompt_logprobs"] = prompt_logprobs(c.prompt_logprobs or (),
                                                             prompt_k, self.decoded_of)
            if token_ids:
                out[-1].update(prompt_token_ids=list(prompt_ids[i // n]),
                               token_ids=list(c.token_ids))
        return {**self._head("text_completion"), "choices": out,
                "usage": choices_usage(choices, n)}

    def completion_logprobs(self, lps: Sequence[TokenLogprob], offset: int,
                            prompt_ids: Sequence[int] | None = None,
                            prompt_lps: Sequence[TokenLogprob | None] | None = None,
                            floor: int | None = None, echo_text: str | None = None
                            ) -> dict[str, Any]:
        """Generated tokens' logprobs, the first at ``offset`` (``floor``: where the
        generated text begins, text_offsets); with ``prompt_ids`` and ``prompt_lps``
        (echo), the prompt's in front, their offsets into ``echo_text``."""
        generated = completion_logprobs(lps, self.text_of, offset, self.shown_of,
                                        self.own_bytes, floor)
        if prompt_ids is None or prompt_lps is None:
            return generated
        return echo_logprobs(prompt_ids, prompt_lps, generated, self.text_of,
                             self.decoded_of, self.own_bytes, echo_text, self.special)

    def completion_chunk(self, index: int, text: str, lps: Sequence[TokenLogprob] | None,
                         reason: FinishReason | None, stop_reason: Any = None,
                         echo: tuple[str, Sequence[int], Sequence[TokenLogprob | None]]
                         | None = None, offset: int = 0, floor: int = 0) -> dict[str, Any]:
        """``echo`` (text, ids, logprobs of the prompt) puts the prompt in front of this
        chunk, logprobs included: the first chunk of an echo + logprobs stream.
        ``offset``: the text_offset of this chunk's first generated token (the choice's
        text before it: next_offset of the chunk before), and ``floor`` where the choice's
        generated text begins (after an echoed prompt), so that a stream's offsets equal
        the whole answer's however its tokens were grouped (a character split across
        chunks included)."""
        prefix = "" if echo is None else echo[0]
        logprobs = None
        if lps is not None:
            logprobs = (self.completion_logprobs(lps, len(prefix) + offset, echo[1], echo[2],
                                                 len(prefix), prefix)
                        if echo is not None else self.completion_logprobs(lps, offset,
                                                                          floor=floor))
        choice = {"index": index, "text": prefix + text, "logprobs": logprobs,
                  "finish_reason": finish_reason(reason)}
        if reason is not None:
            choice["stop_reason"] = stop_reason
        return self._chunk("text_completion", choice)

    def next_offset(self, offset: int, lps: Sequence[TokenLogprob]) -> int:
        """The text_offset after ``lps``, whose first token is at ``offset`` (as
        completion_logprobs counts them: text_offsets)."""
        return text_offsets([lp.token_id for lp in lps], self.shown_of, self.own_bytes,
                            offset)[1]

    def chat(self, choices: Sequence[Choice], want_logprobs: bool,
             readers: Sequence[ChoiceReader], details: dict[str, int] | None = None,
             prompt_ids: Sequence[int] | None = None, prompt_k: int | None = None
             ) -> dict[str, Any]:
        """``readers``: each choice's ChoiceReader, fed its whole output. ``prompt_ids``
        (vLLM's return_token_ids): the answer carries them and each choice its ids.
        ``prompt_k`` (vLLM's prompt_logprobs): the answer carries the prompt's."""
        out = [{"index": i, "message": r.message(),
                "logprobs": chat_logprobs(c.logprobs, self.text_of, self.bytes_of)
                if want_logprobs else None,
                "finish_reason": r.chat_finish_reason(c.finish_reason),
                "stop_reason": c.stop_reason}
               for i, (c, r) in enumerate(zip(choices, readers, strict=True))]
        if prompt_ids is not None:
            for o, c in zip(out, choices, strict=True):
                o["token_ids"] = list(c.token_ids)
        body = {**self._head("chat.completion"), "choices": out,
                "usage": choices_usage(choices, len(choices))}
        if prompt_ids is not None:
            body["prompt_token_ids"] = list(prompt_ids)
        if prompt_k is not None:
            body["prompt_logprobs"] = prompt_logprobs(choices[0].prompt_logprobs or (),
                                                      prompt_k, self.decoded_of)
        if details is not None:
            body["usage"]["completion_tokens_details"] = details
        return body

    def chat_chunk(self, index: int, delta: dict[str, Any],
                   lps: Sequence[TokenLogprob] | None = None,
                   reason: str | None = None) -> dict[str, Any]:
        """``reason``: the OpenAI finish_reason string (ChoiceReader.finish_reason)."""
        choice = {"index": index, "delta": delta,
                  "logprobs": None if lps is None else chat_logprobs(lps, self.text_of,
                                                                    self.bytes_of),
                  "finish_reason": reason}
        return self._chunk("chat.completion.chunk", choice)

    def usage_chunk(self, obj: str, prompt_tokens: int, completion_tokens: int,
                    cached_tokens: int = 0, details: dict[str, int] | None = None
                    ) -> dict[str, Any]:
        return {**self._head(obj), "choices": [],
                "usage": usage(prompt_tokens, completion_tokens, cached_tokens, details)}
