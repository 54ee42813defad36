"""``encrypted_content`` of Responses ``reasoning`` items (``include:
["reasoning.encrypted_content"]``): the item's reasoning text as a Fernet token
(AES-128-CBC with an HMAC-SHA256, the ``cryptography`` package), so that a client that
keeps no state on the server (``store: false``) can send the item back in a later
request's ``input``.

The Fernet key is derived (HKDF-SHA256) from ``FP8SERVE_THINKING_SIGNATURE_KEY``, the
secret that signs Anthropic thinking blocks (service/translate/signature.py), under a
label of its own, so that the two never take one another's values; when that is unset, from
a random secret made at startup (a restarted server, or another replica, cannot open the
items of earlier answers).

On input, an item whose ``encrypted_content`` does not open under this server's key is a
400 naming it, as OpenAI answers one it cannot decrypt; one that opens and carries no
``content`` gets its text back, so that the stored input items list it. Either way the
item is dropped from the prompt, as every reasoning item is
(service/translate/responses.py).
"""

from __future__ import annotations

import base64
import secrets
from collections.abc import Sequence

from cryptography.fernet import Fernet, InvalidToken
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from service.errors import APIError
from service.translate.schemas import InputItem, ReasoningItem, ReasoningText

INCLUDE = "reasoning.encrypted_content"
_LABEL = b"fp8serve reasoning encrypted_content v1"


class ReasoningSeal:
    def __init__(self, secret: bytes | None = None) -> None:
        """``secret``: the server's key (None: 32 random bytes, valid for this process)."""
        secret = secret if secret is not None else secrets.token_bytes(32)
        key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_LABEL).derive(secret)
        self._fernet = Fernet(base64.urlsafe_b64encode(key))

    def seal(self, text: str) -> str:
        return self._fernet.encrypt(text.encode("utf-8", "surrogatepass")).decode("ascii")

    def open(self, token: str) -> str | None:
        """The text ``token`` seals; None when it is not a token of this key (edited, cut,
        or made by another server or key)."""
        try:
            data = self._fernet.decrypt(token.encode("utf-8", "surrogatepass"))
        except (InvalidToken, ValueError):
            return None
        return data.decode("utf-8", "surrogatepass")

    def open_items(self, items: Sequence[InputItem], field: str = "input") -> list[InputItem]:
        """``items`` with each reasoning item's ``encrypted_content`` checked; an item
        without ``content`` gets the text it seals. A 400 naming the first that does not
        open."""
        out = list(items)
        for i, item in enumerate(out):
            if not isinstance(item, ReasoningItem) or item.encrypted_content is None:
                continue
            text = self.open(item.encrypted_content)
            if text is None:
                name = f"{field}.{i}.encrypted_content"
                raise APIError(400, f"{name}: the reasoning item's encrypted content could "
                               "not be decrypted (it was changed, or another server or key "
                               "made it: replicas share FP8SERVE_THINKING_SIGNATURE_KEY)",
                               name)
            if item.content is None:
                out[i] = item.model_copy(update={
                    "content": [ReasoningText(type="reasoning_text", text=text)]})
        return out
