"""A reasoning section before a constraint: what a reasoning model writes under tools,
``response_format`` or ``structured_outputs`` (vLLM applies such a constraint once the
reasoning has ended; mistral-common's tool grammars for v13 tokenizers open with an
optional ``[THINK] ... [/THINK]``).

:func:`reasoning_first` wraps any :class:`GrammarSpec`: an optional section (the begin
marker, any text, the end marker), then the constraint, embedded whole as a nested grammar
(llguidance's ``%lark { ... }``). Up to 8 whitespace characters may separate the section
from a JSON answer or tool calls (mistral-common's ``SAFE_WS``: leading whitespace is
still JSON, and is never a call's); before any other constraint (a regex, a choice, a
grammar, a structural tag) nothing may, as the answer is what the constraint matches from
the end marker on. A prompt that already opened the section (``starts_inside``) makes the
output start inside it, so the end marker must come first. Inside the section every token
is allowed but special ones (a marker that is a special token ends it; a text marker ends
it at its first occurrence), so a thinking budget, which forces the end marker, always
finds it allowed.

Markers are Lark terminals (:func:`marker`): ``<[id]>`` for a marker that is one token of
the vocabulary (a special token such as ``[THINK]``, or an added one such as ``<think>``),
so the section opens and ends with the very tokens a thinking budget and the
reasoning-token count look for; a string literal for a marker that is text of several
tokens.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from engine.structured.spec import GrammarSpec

# whitespace between the section's end and a JSON answer or tool calls ("</think>\n\n{")
GAP = r"/[ \t\r\n]{1,8}/"
# the constraints after which the GAP is allowed: whitespace before them is no part of
# the answer's value (JSON's own leading whitespace; text before calls that the reader
# drops under a forced call, and free text under tool_choice auto)
GAP_KINDS = frozenset({"json_object", "json_schema", "tool_mistral", "tool_hermes"})


@dataclass(frozen=True)
class ReasoningMarkers:
    """begin / end: Lark terminals of the section's markers (see :func:`marker`). end_text:
    the end marker's text where text that spells it ends the section too (it is no
    special token, or the reasoning parser reads it in the text), so the section's text
    never holds it; else None. starts_inside: the prompt opened the section."""

    begin: str
    end: str
    end_text: str | None = None
    starts_inside: bool = False


def marker(tok: Any, text: str) -> tuple[str, bool]:
    """``text`` (a marker such as ``[THINK]`` or ``</think>``) as a Lark terminal of
    tokenizer ``tok`` (engine.text.tokenizer.Tokenizer) -> (terminal, is_special):
    ``<[id]>`` when it is one token of the vocabulary (text never matches a special
    token; an added token spelled in pieces would be a marker neither the thinking budget
    nor the reasoning-token count sees), else its literal."""
    tid = tok.token_to_id(text)
    if tid is not None:
        return f"<[{tid}]>", tok.is_special(tid)
    return json.dumps(text), False


def markers_for(tok: Any, begin: str, end: str, starts_inside: bool = False,
                read_in_text: bool = False) -> ReasoningMarkers:
    """The section markers ``begin`` / ``end`` of tokenizer ``tok``. ``read_in_text``: the
    reasoning parser also finds the end marker in the text (``<think>`` tags, even where
    they are special tokens), not only as its token (``[/THINK]``)."""
    b, _ = marker(tok, begin)
    e, special = marker(tok, end)
    return ReasoningMarkers(b, e, end if read_in_text or not special else None,
                            starts_inside)


def _regex_literal(text: str) -> str:
    return re.escape(text).replace("/", chr(92) + "/")


def _rest_of_section(m: ReasoningMarkers) -> str:
    """Rules for the section after its begin marker: any text, then the end marker."""
    if m.end_text is None:  # only its token ends the section, and text cannot contain it
        return f"section_rest: SECTION_TEXT? {m.end}\nSECTION_TEXT: /(.|\\n)+/\n"
    end = _regex_literal(m.end_text)
    if m.end.startswith("<["):  # one token: the text before it never spells its text
        return (f"section_rest: SECTION_TEXT? {m.end}\n"
                f"SECTION_TEXT: /(.|\\n)+/ & ~/(?s:.*){end}(?s:.*)/\n")
    # a text marker: the shortest text that ends with it (its first occurrence)
    return f"section_rest[lazy]: /(.|\\n)*{end}/\n"


def reasoning_first(spec: GrammarSpec, m: ReasoningMarkers) -> GrammarSpec:
    """``spec`` after an optional reasoning section (a required one's end when the output
    starts inside it); name and kind stay the constraint's."""
    gap = "GAP? " if spec.kind in GAP_KINDS else ""
    head = f"section_rest ({gap}answer)" if m.starts_inside else \
        f"({m.begin} section_rest {gap.strip()})? answer"
    lark = (f"start: {head}\n{_rest_of_section(m)}"
            + (f"GAP: {GAP}\n" if gap else "")
            + f"answer: %lark {{\n{spec.lark}\n}}\n")
    return GrammarSpec(lark, spec.name, spec.kind)
