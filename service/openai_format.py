"""Engine outputs -> OpenAI response / stream-chunk dicts (completions and chat)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

from engine.request import FinishReason
from engine.stream import TokenLogprob
from service.errors import APIError
from service.generation import Choice
from service.tool_calls.choice import ChoiceReader

TokenText = Callable[[int], str]
TokenBytes = Callable[[int], bytes]  # a token's own bytes (Tokenizer.token_bytes)


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


def text_offsets(ids: Sequence[int], text_of: TokenText, bytes_of: TokenBytes | None = None,
                 start: int = 0, floor: int | None = None, text: str | None = None,
                 special: Callable[[int], bool] | None = None) -> tuple[list[int], int]:
    """Where each token's text starts in the text, the first at ``start``, and the offset
    after the last: a token counts its text's characters; one whose bytes (``bytes_of``)
    hold a part of a UTF-8 character (byte-level BPE splits them) counts the characters it
    starts, and one that goes on with a character is at that character's start, so the
    offsets stay offsets into the text. ``floor`` (default ``start``): where the tokens'
    text begins; a stream's chunk starts at ``start`` past it, and its first token may go
    on with a character an earlier chunk began. ``text`` (with ``special``): the text the
    offsets index; a special token whose text it does not hold at the token's place (the
    BOS a tokenizer adds to a prompt sent as text) takes no room in it."""
    offsets, pos = [], start
    floor = start if floor is None else floor
    for t in ids:
        raw = bytes_of(t) if bytes_of is not None else b""
        if raw.decode("utf-8", "ignore").encode() == raw:  # whole characters
            offsets.append(pos)
            own = text_of(t)
            if text is None or special is None or not special(t) or text.startswith(own, pos):
                pos += len(own)
        else:
            offsets.append(max(pos - _continues(raw[0]), floor))
            pos += sum(not _continues(b) for b in raw)
    return offsets, pos


def _continues(byte: int) -> bool:
    """A UTF-8 continuation byte (10xxxxxx): it goes on with a character."""
    return byte & 0xC0 == 0x80


def completion_logprobs(lps: Sequence[TokenLogprob], text_of: TokenText,
                        offset: int = 0, real_text: TokenText | None = None,
                        bytes_of: TokenBytes | None = None,
                        floor: int | None = None) -> dict[str, Any]:
    """``text_of`` names the tokens; text_offset counts ``real_text`` (default
    ``text_of``) and ``bytes_of`` (text_offsets, with ``floor``): offsets stay offsets
    into the answer's text when tokens are named by id or split a character."""
    tokens = [text_of(lp.token_id) for lp in lps]
    offsets, _ = text_offsets([lp.token_id for lp in lps], real_text or text_of, bytes_of,
                              offset, floor)
    return {"tokens": tokens, "token_logprobs": [lp.logprob for lp in lps],
            "top_logprobs": [_top_with_token(lp, text_of) for lp in lps],
            "text_offset": offsets}


def _top_with_token(lp: TokenLogprob, text_of: TokenText) -> dict[str, float]:
    """A completion token's top_logprobs: the token itself, then its alternatives (OpenAI:
    up to logprobs + 1 entries, the token's own always there; vLLM's order)."""
    return {text_of(lp.token_id): lp.logprob, **{text_of(t): v for t, v in lp.top}}


def echo_logprobs(prompt_ids: Sequence[int], prompt_lps: Sequence[TokenLogprob | None],
                  generated: dict[str, Any], text_of: TokenText,
                  real_text: TokenText | None = None,
                  bytes_of: TokenBytes | None = None, text: str | None = None,
                  special: Callable[[int], bool] | None = None) -> dict[str, Any]:
    """Completion logprobs with the echoed prompt in front (OpenAI's echo + logprobs): one
    entry per prompt token, the first with null logprobs (it has no context), offsets from
    0 into the echoed ``text`` (text_offsets); ``generated`` (completion_logprobs with the
    prompt text's length as offset) follows."""
    tokens = [text_of(t) for t in prompt_ids]
    offsets, _ = text_offsets(prompt_ids, real_text or text_of, bytes_of, text=text,
                              special=special)
    return {
        "tokens": tokens + generated["tokens"],
        "token_logprobs": [None if lp is None else lp.logprob for lp in prompt_lps]
        + generated["token_logprobs"],
        "top_logprobs": [None if lp is None else _top_with_token(lp, text_of)
                         for lp in prompt_lps] + generated["top_logprobs"],
        "text_offset": offsets + generated["text_offset"],
    }


def _top_cut(lps: Sequence[TokenLogprob | None] | None, k: int | None
             ) -> Sequence[TokenLogprob | None] | None:
    """Prompt logprobs with at most ``k`` alternatives each (None: as they are)."""
    if lps is None or k is None:
        return lps
    return [None if lp is None else TokenLogprob(lp.token_id, lp.logprob, lp.top[:k],
                                                 lp.rank) for lp in lps]


def prompt_logprobs(lps: Sequence[TokenLogprob | None], k: int, text_of: TokenText
                    ) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's prompt_logprobs: per prompt token (the first null), its own id and its ``k``
    likeliest alternatives, each id (a JSON key) -> logprob, rank and decoded_token."""
    out: list[dict[str, dict[str, Any]] | None] = []
    for lp in lps:
        if lp is None:
            out.append(None)
            continue
        entry = {str(lp.token_id): {"logprob": lp.logprob, "rank": lp.rank,
                                    "decoded_token": text_of(lp.token_id)}}
        for rank, (tid, value) in enumerate(lp.top[:k], 1):
            entry.setdefault(str(tid), {"logprob": value, "rank": rank,
                                        "decoded_token": text_of(tid)})
        out.append(entry)
    return out


def chat_logprobs(lps: Sequence[TokenLogprob], text_of: TokenText,
                  bytes_of: TokenBytes | None = None) -> dict[str, Any]:
    """OpenAI's chat logprobs; ``bytes`` is each token's own bytes (``bytes_of``; the
    text's UTF-8 without it), so the bytes of consecutive tokens join into the text."""
    def entry(tid: int, lp: float) -> dict[str, Any]:
        text = text_of(tid)
        raw = bytes_of(tid) if bytes_of is not None else text.encode("utf-8")
        return {"token": text, "logprob": lp, "bytes": list(raw)}

    return {"content": [{**entry(lp.token_id, lp.logprob),
                         "top_logprobs": [entry(t, v) for t, v in lp.top]} for lp in lps]}


class Formatter:
    """Builds bodies for one HTTP request (fixed id, created time and model name)."""

    def __init__(self, rid: str, model: str, text_of: TokenText,
                 bytes_of: TokenBytes | None = None,
                 decoded_of: TokenText | None = None,
                 own_bytes: TokenBytes | None = None,
                 shown_of: TokenText | None = None,
                 special: Callable[[int], bool] | None = None) -> None:
        """``text_of`` / ``bytes_of`` name tokens in logprobs; ``decoded_of`` (default
        ``text_of``) is each token's text: prompt_logprobs' decoded_token and what
        text_offset counts, with ``own_bytes`` (default ``bytes_of``), each token's own
        bytes, for the tokens that split a character (text_offsets); ``shown_of``
        (default ``decoded_of``) is a generated token's text as the answer shows it (a
        special token's is empty where skip_special_tokens leaves it out); ``special``
        tells the special tokens (an echoed prompt's offsets: text_offsets)."""
        self.special = special
        self.id, self.model, self.text_of, self.bytes_of = rid, model, text_of, bytes_of
        self.decoded_of = text_of if decoded_of is None else decoded_of
        self.shown_of = self.decoded_of if shown_of is None else shown_of
        self.own_bytes = bytes_of if own_bytes is None else own_bytes
        self.created = int(time.time())

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

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
                            _top_cut(c.prompt_logprobs, logprobs), echo_text=prefix)
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
        return {**self._head("text_completion"), "choices": [choice]}

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
        return {**self._head("chat.completion.chunk"), "choices": [choice]}

    def usage_chunk(self, obj: str, prompt_tokens: int, completion_tokens: int,
                    cached_tokens: int = 0, details: dict[str, int] | None = None
                    ) -> dict[str, Any]:
        return {**self._head(obj), "choices": [],
                "usage": usage(prompt_tokens, completion_tokens, cached_tokens, details)}


def page_items(items: list[dict[str, Any]], limit: int, order: str, after: str | None,
               where: str, keep: Callable[[dict[str, Any]], bool] | None = None
               ) -> dict[str, Any]:
    """OpenAI's item list page: ``order`` asc or desc, the items after the one whose id
    is ``after`` (else a 400 naming it: "is no ``where``"), at most ``limit``; ``keep``:
    a filter, applied after the cursor is found among all ``items`` (a cursor that no
    longer passes it, its metadata changed meanwhile, still places the next page)."""
    if order == "desc":
        items = items[::-1]
    if after is not None:
        at = next((i for i, item in enumerate(items) if item["id"] == after), None)
        if at is None:
            raise APIError(400, f"after: {after!r} is no {where}", "after")
        items = items[at + 1:]
    if keep is not None:
        items = [item for item in items if keep(item)]
    page = items[:limit]
    return {"object": "list", "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None, "has_more": len(items) > limit}
