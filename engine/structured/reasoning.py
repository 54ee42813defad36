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

Markers are Lark terminals: ``<[id]>`` for a special token, a string literal otherwise
(:func:`marker`).
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
    the end marker's text when it is not a special token (the section ends at its first
    occurrence), else None. starts_inside: the prompt opened the section."""

    begin: str
    end: str
    end_text: str | None = None
    starts_inside: bool = False


def marker(tok: Any, text: str) -> tuple[str, bool]:
    """``text`` (a marker such as ``[THINK]`` or ``</think>``) as a Lark terminal of
    tokenizer ``tok`` (engine.text.tokenizer.Tokenizer) -> (terminal, is_special):
    ``<[id]>`` when it is a special token (text never matches one), else its literal."""
    tid = tok.token_to_id(text)
    if tid is not None and tok.is_special(tid):
        return f"<[{tid}]>", True
    return json.dumps(text), False


def markers_for(tok: Any, begin: str, end: str, starts_inside: bool = False
                ) -> ReasoningMarkers:
    """The section markers ``begin`` / ``end`` of tokenizer ``tok``."""
    b, _ = marker(tok, begin)
    e, special = marker(tok, end)
    return ReasoningMarkers(b, e, None if special else end, starts_inside)


def _rest_of_section(m: ReasoningMarkers) -> str:
    """Rules for the section after its begin marker: any text, then the end marker."""
    if m.end_text is None:  # a special token: text cannot contain it
        return f"section_rest: SECTION_TEXT? {m.end}\nSECTION_TEXT: /(.|\\n)+/\n"
    # a text marker: the shortest text that ends with it (its first occurrence)
    return f"section_rest[lazy]: /(.|\\n)*{re.escape(m.end_text).replace('/', chr(92) + '/')}/\n"


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

