"""Signatures of Anthropic ``thinking`` blocks: base64 of HMAC-SHA256 over the block's
thinking text, keyed by ``FP8SERVE_THINKING_SIGNATURE_KEY`` (set it to keep signatures valid
across restarts and replicas) or, when that is unset, by a random key made at startup.

Anthropic's clients send thinking blocks back with their signature. On input a thinking
block in the history whose signature does not verify (edited, or signed by another server
or key) is a 400 naming it, as Anthropic answers; an unsigned block (``signature`` "" or
left out: another source, or this server before it signed) is accepted. Either way the
block is dropped from the prompt (service/translate/anthropic.py), so unverified text
never reaches the model.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import secrets
from collections.abc import Sequence

from service.errors import APIError
from service.translate.schemas import AnthropicMessage, ThinkingBlock

_DOMAIN = b"fp8serve thinking v1\0"  # what the MAC is of, so the key signs nothing else


def _utf8(text: str) -> bytes:
    """Any JSON string's bytes (a lone surrogate included: JSON can carry one)."""
    return text.encode("utf-8", "surrogatepass")


class ThinkingSigner:
    def __init__(self, key: bytes | None = None) -> None:
        """``key``: the secret (None: 32 random bytes, valid for this process only)."""
        self._key = key if key is not None else secrets.token_bytes(32)

    def sign(self, thinking: str) -> str:
        mac = hmac.new(self._key, _DOMAIN + _utf8(thinking), hashlib.sha256).digest()
        return base64.b64encode(mac).decode("ascii")

    def verifies(self, thinking: str, signature: str) -> bool:
        return hmac.compare_digest(self.sign(thinking).encode("ascii"), _utf8(signature))

    def check_history(self, messages: Sequence[AnthropicMessage]) -> None:
        """A 400 naming the first signed thinking block whose signature does not verify."""
        for i, m in enumerate(messages):
            for j, block in enumerate(m.content if isinstance(m.content, list) else ()):
                if (isinstance(block, ThinkingBlock) and block.signature
                        and not self.verifies(block.thinking, block.signature)):
                    field = f"messages.{i}.content.{j}.signature"
                    raise APIError(400, f"{field}: invalid signature in thinking block (the "
                                   "thinking text was changed, or another server signed "
                                   "it)", field)
