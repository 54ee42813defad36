"""``tekken.json`` through mistral-common's Tekkenizer, behind the same backend interface
as tokenizer.json (engine/text/tokenizer.py). Special-token strings in text are encoded as their
ids (``<s>[INST]Hello, world![/INST]`` -> [1, 3, 22177, 1044, 4304, 1033, 4])."""

from __future__ import annotations

import re
from collections.abc import Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from engine.text.backend import TokenizerLoadError
from engine.text.chat_template import ChatTemplateError


class TekkenBackend:
    def __init__(self, path: Path) -> None:
        from mistral_common.tokens.tokenizers.tekken import Tekkenizer

        try:
            self._tok = Tekkenizer.from_file(str(path))
        except KeyError as exc:  # a key the file lacks: str(exc) is the bare key's repr
            raise TokenizerLoadError(f"{path}: cannot load tekken tokenizer: missing key "
                                     f"{exc}") from exc
        except Exception as exc:  # mistral-common raises several unrelated types
            raise TokenizerLoadError(f"{path}: cannot load tekken tokenizer: {exc}") from exc
        self.path = path
        n_special = self._tok.num_special_tokens
        self._special = frozenset(range(n_special))
        self._special_by_text = {self._tok.id_to_piece(i): i for i in range(n_special)}
        pattern = "|".join(re.escape(t) for t in sorted(self._special_by_text, key=len,
                                                        reverse=True))
        self._split = re.compile(f"({pattern})")
        self.default_bos_id: int = self._tok.bos_id
        self.default_eos_id: int = self._tok.eos_id

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        ids = [self.default_bos_id] if add_special_tokens else []
        for i, piece in enumerate(self._split.split(text)):
            if i % 2:  # odd pieces are the special-token separators
                ids.append(self._special_by_text[piece])
            elif piece:
                ids.extend(self._tok.encode(piece, bos=False, eos=False))
        return ids

    def encode_plain(self, text: str) -> list[int]:
        """``text`` as characters: special-token strings in it are not their ids."""
        return list(self._tok.encode(text, bos=False, eos=False))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

        policy = SpecialTokenPolicy.IGNORE if skip_special_tokens else SpecialTokenPolicy.KEEP
        # ids past the vocabulary (a model whose vocab_size pads tekken.json's) decode to
        # nothing, as tokenizer.json's do (mistral-common raises on them)
        known = [i for i in ids if 0 <= i < self._tok.n_words]
        return self._tok.decode(known, special_token_policy=policy)

    def id_to_token(self, token_id: int) -> str | None:
        if not 0 <= token_id < self._tok.n_words:
            return None
        return self._tok.id_to_piece(token_id)

    def token_to_id(self, token: str) -> int | None:
        return self._special_by_text.get(token)

    def token_bytes(self, token_id: int) -> bytes:
        """The vocabulary's bytes (Tekken stores bytes); a special token's text."""
        from mistral_common.tokens.tokenizers.base import SpecialTokenPolicy

        if not 0 <= token_id < self._tok.n_words:
            return b""
        return self._tok.id_to_byte_piece(token_id, SpecialTokenPolicy.KEEP)

    @property
    def vocab_size(self) -> int:
        return self._tok.n_words

    @property
    def id_bound(self) -> int:
        return self._tok.n_words  # dense ids

    @property
    def special_ids(self) -> frozenset[int]:
        return self._special

    @property
    def tekkenizer(self) -> Any:
        """mistral-common's Tekkenizer (for llguidance, engine/structured/ll_tokenizer.py)."""
        return self._tok

    @cached_property
    def _mistral(self) -> Any:
        from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

        tok = MistralTokenizer.from_file(str(self.path))
        img = self._special_by_text.get("[IMG]")
        if img is not None and hasattr(tok.instruct_tokenizer, "image_encoder"):
            tok.instruct_tokenizer.image_encoder = _OneImageToken(img)
        return tok

    def chat_encoder(self, messages: list[dict[str, Any]],
                     tools: list[dict[str, Any]] | None = None,
                     continue_final_message: bool = False) -> tuple[list[int], str]:
        """mistral-common's own request encoding: OpenAI-format messages (tool calls with
        JSON-text arguments, tool results with ``tool_call_id``) and tools -> (ids, text).
        A v13 tekken.json (Ministral-3) puts the tools before the first user message as
        ``[AVAILABLE_TOOLS]...[/AVAILABLE_TOOLS]``. ``continue_final_message``: the final
        assistant message is a prefix the model continues (mistral-common's ``prefix``)."""
        from mistral_common.exceptions import MistralCommonException
        from mistral_common.protocol.instruct.request import ChatCompletionRequest
        from pydantic import ValidationError

        try:
            request = ChatCompletionRequest.from_openai(
                messages, tools or None, continue_final_message=continue_final_message)
            out = self._mistral.encode_chat_completion(request)
        except (MistralCommonException, ValidationError, ValueError) as exc:
            raise ChatTemplateError(f"invalid chat messages: {exc}") from exc
        return list(out.tokens), out.text or ""


class _OneImageToken:
    """Stands in for mistral-common's ImageEncoder inside encode_chat_completion: each
    image chunk becomes one [IMG] (the server expands it to the image's layout, from its
    own preprocessing; mistral-common's would need OpenCV and the image itself)."""

    def __init__(self, img_id: int) -> None:
        self.img_id = img_id

    def __call__(self, chunk: Any) -> Any:
        import numpy as np
        from mistral_common.tokens.tokenizers.image import ImageEncoding

        return ImageEncoding(tokens=[self.img_id], image=np.zeros((3, 1, 1), np.float32))
