"""Keeps a parser's text in step with the engine's text when stop strings can cut it.

The parsers decode token ids themselves (structural tokens must be seen as ids), while the
engine's text stops at a stop string and holds back what could be the start of one. The gate
releases the parser's pieces in order, text only as far as the engine's text has reached
(counted in characters), a structural id once everything before it is released; at the end,
whatever lies beyond the engine's final text is dropped. Both sides decode the same ids with
special tokens skipped, so their texts agree character for character.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from service.tool_calls.pieces import Piece


class TextGate:
    def __init__(self) -> None:
        self._queue: deque[Piece] = deque()
        self._budget = 0  # engine characters not yet matched by released text
        self.used = False  # whether push was ever called

    def push(self, pieces: Sequence[Piece], engine_text: str) -> list[Piece]:
        """Queue ``pieces``; the engine has produced ``engine_text`` more characters."""
        self.used = True
        self._queue.extend(pieces)
        self._budget += len(engine_text)
        return self._release()

    def finish(self) -> list[Piece]:
        """The output ended: release what the engine's text covers, drop the rest."""
        out = self._release()
        self._queue.clear()
        return out

    def _release(self) -> list[Piece]:
        out: list[Piece] = []
        while self._queue:
            head = self._queue[0]
            if isinstance(head, int):
                out.append(self._queue.popleft())
                continue
            if self._budget <= 0:
                break
            take = head[:self._budget]
            self._budget -= len(take)
            out.append(take)
            if len(take) == len(head):
                self._queue.popleft()
            else:
                self._queue[0] = head[len(take):]
        return out
