"""A streaming scanner for the v3-v7 call list ``[{"name": ..., "arguments": {...}}, ...]``.

Text is scanned a character at a time, strings and escapes respected, so the result does not
depend on how the text is chunked. Outside objects, ``[``, ``,``, ``]`` and whitespace are
list syntax and dropped; any other character is stray text. Each top-level ``{...}`` is
returned whole when it closes. ``finish()`` returns an object that never closed as text.
"""

from __future__ import annotations

SYNTAX = frozenset("[],\t\n\r ")


class JsonListScanner:
    def __init__(self) -> None:
        self._obj = ""  # the object being read ("" when outside one)
        self._depth = 0
        self._in_string = False
        self._escape = False

    def feed(self, text: str) -> list[tuple[str, str]]:
        """("object", raw) for each object closed, ("text", raw) for stray text."""
        out: list[tuple[str, str]] = []
        for ch in text:
            if self._depth == 0:
                if ch == "{":
                    self._obj, self._depth = "{", 1
                elif ch not in SYNTAX:
                    out.append(("text", ch))
                continue
            self._obj += ch
            if self._escape:
                self._escape = False
            elif self._in_string:
                self._escape = ch == "\\"
                self._in_string = ch != '"'
            elif ch == '"':
                self._in_string = True
            elif ch in "{[":
                self._depth += 1
            elif ch in "}]":
                self._depth -= 1
                if self._depth == 0:
                    out.append(("object", self._obj))
                    self._obj = ""
        return _merge_text(out)

    def finish(self) -> list[tuple[str, str]]:
        rest, self._obj, self._depth, self._in_string = self._obj, "", 0, False
        return [("text", rest)] if rest else []


def _merge_text(items: list[tuple[str, str]]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for kind, raw in items:
        if kind == "text" and out and out[-1][0] == "text":
            out[-1] = ("text", out[-1][1] + raw)
        else:
            out.append((kind, raw))
    return out
