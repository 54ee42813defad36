"""Text split at literal tags (``<tool_call>``, ``<think>``), fed in chunks of any size.

``TagSplitter(open, close)`` returns ("out", text) for text outside a block, ("in", text)
for text inside one (streamed as it comes) and ("close", "") when a block ends; text that
could still be the start of the awaited tag is held back (engine.text.detokenizer's
held_suffix_len), so no part of a tag is ever returned as text.
"""

from __future__ import annotations

from collections.abc import Callable

from engine.text.detokenizer import held_suffix_len


class TagSplitter:
    """``closes(block)``: whether a close tag found after ``block`` (the block's text so
    far) ends the block; False keeps the tag as the block's text (a ``</tool_call>``
    inside a JSON string of the call). None: every close tag does."""

    def __init__(self, open_tag: str, close_tag: str, inside: bool = False,
                 closes: Callable[[str], bool] | None = None) -> None:
        self._tags = (open_tag, close_tag)
        self.inside = inside
        self._held = ""
        self._closes = closes
        self._block = ""  # the open block's text, kept only for closes

    def feed(self, text: str) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        buf, self._held = self._held + text, ""
        while buf:
            tag = self._tags[self.inside]
            where = "in" if self.inside else "out"
            idx = buf.find(tag)
            if idx < 0:
                hold = held_suffix_len(buf, [tag])
                self._held = buf[len(buf) - hold:] if hold else ""
                _add(out, where, buf[: len(buf) - hold])
                if self.inside and self._closes is not None:
                    self._block += buf[: len(buf) - hold]
                break
            if self.inside and self._closes is not None:
                self._block += buf[:idx]
                if not self._closes(self._block):  # the tag is the block's text
                    self._block += tag
                    _add(out, where, buf[:idx + len(tag)])
                    buf = buf[idx + len(tag):]
                    continue
                self._block = ""
            _add(out, where, buf[:idx])
            if self.inside:
                out.append(("close", ""))
            self.inside = not self.inside
            buf = buf[idx + len(tag):]
        return out

    def finish(self) -> list[tuple[str, str]]:
        """The text held back (it never became a tag)."""
        out: list[tuple[str, str]] = []
        _add(out, "in" if self.inside else "out", self._held)
        self._held = ""
        return out


def _add(out: list[tuple[str, str]], where: str, text: str) -> None:
    if text:
        out.append((where, text))
