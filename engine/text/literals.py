"""A chat's own text is text: a control token's string inside a message, a tool's
description or a call's arguments (``[INST]``, ``[TOOL_CALLS]``, ``<|im_start|>``) is
encoded as the characters it is, as mistral-common encodes it, never as the control
token. Only the chat template's own markup becomes control tokens.

Before the template renders, every such string in the messages and the template's other
inputs is swapped for a mark (digits and underscores, which case changes, JSON quoting
and trimming leave as they are), and so are a string's ends that could join another
string into one (``"[TOOL_"`` then ``"CALLS]"`` in two content parts): a tail that begins
a control-token string, a head that ends one. A call's JSON arguments are read first
(the template gets them as objects, so an escaped ``\u005bINST]`` would become one).
After, the rendered text is split on control-token strings, which are then the
template's alone. A span holding marks is encoded with its
strings put back and control tokens not parsed (``Backend.encode_plain``); the others as
before. A chat with no such string is encoded exactly as before.

    lit = Literals(ControlStrings(texts))  # texts: the vocabulary's control-token strings
    messages = lit.hide(messages)         # then render the template on what hide returned
    ids = lit.encode(rendered, backend)   # or lit.restore(rendered): the text as written
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from engine.text.backend import Backend


def _trie(texts: Sequence[str]) -> str:
    """A regex matching any of ``texts`` (the longest at a position), as a trie: a
    position is tried once per character of a shared prefix, not once per string (the
    Tekken vocabulary has a thousand control tokens)."""
    root: dict[str, Any] = {}
    for t in texts:
        node = root
        for ch in t:
            node = node.setdefault(ch, {})
        node[""] = {}

    def walk(node: dict[str, Any]) -> str:
        alts = [re.escape(ch) + walk(sub) for ch, sub in sorted(node.items()) if ch]
        if not alts:
            return ""
        body = alts[0] if len(alts) == 1 else f"(?:{'|'.join(alts)})"
        return f"(?:{body})?" if "" in node else body

    return walk(root)


class ControlStrings:
    """The vocabulary's control-token strings: a pattern that splits a text on them, and
    what can join into one (their proper prefixes and suffixes)."""

    def __init__(self, texts: Sequence[str]) -> None:
        texts = sorted({t for t in texts if t})
        self.split = re.compile(f"({_trie(texts)})")
        self.prefixes = {t[:k] for t in texts for k in range(1, len(t))}
        self.suffixes = {t[k:] for t in texts for k in range(1, len(t))}
        self.longest = max(map(len, texts))


def control_strings(texts: Sequence[str]) -> ControlStrings | None:
    """The control-token strings of ``texts`` (None: none)."""
    return ControlStrings(texts) if any(texts) else None


class Literals:
    """The control-token strings of one chat's inputs, hidden behind marks."""

    def __init__(self, control: ControlStrings | None) -> None:
        self._control = control
        self._mark = f"_{secrets.randbelow(10**12):012d}_"  # never a user's by chance
        self._back = re.compile(re.escape(self._mark) + r"(\d+)_")
        self.found: list[str] = []

    @property
    def used(self) -> bool:
        return bool(self.found)

    def hide(self, value: Any) -> Any:
        """``value`` with each control-token string in its strings (mapping keys too)
        swapped for a mark; containers are copied, other values kept."""
        if self._control is None:
            return value
        if isinstance(value, str):
            return self._hide_str(value)
        if isinstance(value, Mapping):
            return {self.hide(k): self._hide_arguments(v) if k == "arguments"
                    else self.hide(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self.hide(v) for v in value)
        return value

    def _hide_arguments(self, value: Any) -> Any:
        """A call's arguments: JSON text is read (the template gets the object) and
        written back with its strings hidden; other text as any string."""
        if isinstance(value, str):
            try:
                parsed = json.loads(value)
            except ValueError:
                return self.hide(value)
            return json.dumps(self.hide(parsed), ensure_ascii=False)
        return self.hide(value)

    def _hide_str(self, text: str) -> str:
        c = self._control
        assert c is not None
        tail = next((k for k in range(min(len(text), c.longest - 1), 0, -1)
                     if text[-k:] in c.prefixes), 0)
        head = next((k for k in range(min(len(text) - tail, c.longest - 1), 0, -1)
                     if text[:k] in c.suffixes), 0)
        body = c.split.sub(self._hide_one, text[head:len(text) - tail])
        return (self._mark_of(text[:head]) if head else "") + body + (
            self._mark_of(text[len(text) - tail:]) if tail else "")

    def _hide_one(self, match: re.Match[str]) -> str:
        return self._mark_of(match.group(0))

    def _mark_of(self, text: str) -> str:
        self.found.append(text)
        return f"{self._mark}{len(self.found) - 1}_"

    def restore(self, text: str) -> str:
        """``text`` with every mark back as the string it hid."""
        if not self.found:
            return text
        return self._back.sub(lambda m: self.found[int(m.group(1))], text)

    def encode(self, rendered: str, backend: Backend) -> list[int]:
        """Ids of a rendered template (no BOS added): its control-token strings are the
        template's own (the inputs' are marks), each one id; a span between them that
        holds marks is encoded as plain text with the hidden strings back."""
        if not self.found or self._control is None:
            return backend.encode(rendered, add_special_tokens=False)
        ids: list[int] = []
        for i, part in enumerate(self._control.split.split(rendered)):
            if i % 2:
                tid = backend.token_to_id(part)
                assert tid is not None, part
                ids.append(tid)
            elif self._back.search(part):
                ids += backend.encode_plain(self.restore(part))
            elif part:
                ids += backend.encode(part, add_special_tokens=False)
        return ids
