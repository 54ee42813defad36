"""Logprob entries in OpenAI's shapes: completions' ``logprobs`` (``tokens``,
``token_logprobs``, ``top_logprobs``, ``text_offset``), the echoed prompt's, vLLM's
``prompt_logprobs``, and chat's ``content`` entries with each token's bytes
(service/openai_format.py builds the bodies around them)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from engine.stream import TokenLogprob

TokenText = Callable[[int], str]
TokenBytes = Callable[[int], bytes]  # a token's own bytes (Tokenizer.token_bytes)


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


def top_cut(lps: Sequence[TokenLogprob | None] | None, k: int | None
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
