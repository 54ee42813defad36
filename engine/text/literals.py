"""A chat's own text is text: a control token's string inside a message, a tool's
description or a call's arguments (``[INST]``, ``[TOOL_CALLS]``, ``<|im_start|>``) is
encoded as the characters it is, as mistral-common encodes it, never as the control
token. Only the chat template's own markup becomes control tokens.

Before the template renders, every such string in the messages and the template's other
inputs is swapped for a mark (digits and underscores, which case changes, JSON quoting
and trimming leave as they are); after, the rendered text is split on control-token
strings, which are then the template's alone. A span holding marks is encoded with its
strings put back and control tokens not parsed (``Backend.encode_plain``); the others as
before. A chat with no such string is encoded exactly as before.

    lit = Literals(pattern)               # pattern: the vocabulary's control-token strings
    messages = lit.hide(messages)         # then render the template on what hide returned
    ids = lit.encode(rendered, backend)   # or lit.restore(rendered): the text as written
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from typing import Any

from engine.text.backend import Backend


def control_pattern(texts: Sequence[str]) -> re.Pattern[str] | None:
    """One capturing pattern for the control-token strings (longest first); None: none."""
    texts = sorted({t for t in texts if t}, key=len, reverse=True)
    return re.compile(f"({'|'.join(map(re.escape, texts))})") if texts else None


class Literals:
    """The control-token strings of one chat's inputs, hidden behind marks."""

    def __init__(self, pattern: re.Pattern[str] | None) -> None:
        self._pattern = pattern
        self._mark = f"_{secrets.randbelow(10**12):012d}_"  # never a user's by chance
        self._back = re.compile(re.escape(self._mark) + r"(\d+)_")
        self.found: list[str] = []

    @property
    def used(self) -> bool:
        return bool(self.found)

    def hide(self, value: Any) -> Any:
        """``value`` with each control-token string in its strings (mapping keys too)
        swapped for a mark; containers are copied, other values kept."""
        if self._pattern is None:
            return value
        if isinstance(value, str):
            return self._pattern.sub(self._hide_one, value)
        if isinstance(value, Mapping):
            return {self.hide(k): self.hide(v) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return type(value)(self.hide(v) for v in value)
        return value

    def _hide_one(self, match: re.Match[str]) -> str:
        self.found.append(match.group(0))
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
        if not self.found or self._pattern is None:
            return backend.encode(rendered, add_special_tokens=False)
        ids: list[int] = []
        for i, part in enumerate(self._pattern.split(rendered)):
            if i % 2:
                tid = backend.token_to_id(part)
                assert tid is not None, part
                ids.append(tid)
            elif self._back.search(part):
                ids += backend.encode_plain(self.restore(part))
            elif part:
                ids += backend.encode(part, add_special_tokens=False)
        return ids
