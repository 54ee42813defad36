"""The model's tokenizer and chat template, loaded from a checkpoint directory.

``tokenizer.json`` goes through the ``tokenizers`` library; a directory with only
``tekken.json`` goes through mistral-common's Tekkenizer (engine/text/tokenizer_tekken.py). Special
token strings in a text to encode (``<s>``, ``[INST]``, ``<|im_start|>``) are encoded as
their single ids, as Hugging Face does (a completion's prompt, vLLM's default).

Chat prompts: :meth:`Tokenizer.encode_chat` renders the template and encodes the text with
``add_special_tokens=False`` (the template writes BOS itself, so it is never doubled).
There only the template's own markup becomes special tokens: the same strings in the
messages, tools and other inputs are text, as mistral-common encodes them
(engine/text/literals.py). A Tekken model without a jinja template is encoded by
mistral-common's own request encoder (``encode_chat_completion``; ``tools=[...]`` in
OpenAI form are passed to it).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from functools import cached_property
from pathlib import Path
from typing import Any

from engine.text.backend import Backend, TokenizerLoadError
from engine.text.chat_template import (
    PARTS,
    ChatTemplateError,
    cut_after_final_message,
    load_chat_template,
    normalize_messages,
    render_chat_template,
    template_reads,
)
from engine.text.content_format import CONTENT_FORMATS, detect_content_format
from engine.text.literals import Literals, control_strings
from engine.text.token_bytes import PieceBytes

__all__ = ["TOKENIZER_MODES", "ChatTemplateError", "Tokenizer", "TokenizerLoadError"]

TOKENIZER_MODES = ("auto", "hf", "mistral")

log = logging.getLogger(__name__)


class HfBackend:
    """tokenizer.json through the ``tokenizers`` library."""

    def __init__(self, path: Path) -> None:
        from tokenizers import Tokenizer as HfTokenizer

        self.path = path
        try:
            self._tok = HfTokenizer.from_file(str(path))
        except Exception as exc:  # the library raises a bare Exception on bad JSON
            raise TokenizerLoadError(f"{path}: cannot load tokenizer: {exc}") from exc
        added = self._tok.get_added_tokens_decoder()
        self._special = frozenset(i for i, t in added.items() if t.special)
        self._added = frozenset(added)
        self._piece_bytes = PieceBytes(json.loads(self._tok.to_str()).get("decoder"))

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        # encode_batch, one text: the same ids; unlike encode, it lets go of the GIL while
        # it works (a 10 MB text held the event loop, /health among it, 7.9 s; now 0.35 s)
        return self._tok.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def encode_plain(self, text: str) -> list[int]:
        """``text`` as characters: special-token strings in it are not their ids."""
        return self._plain.encode_batch([text], add_special_tokens=False)[0].ids

    @cached_property
    def _plain(self) -> Any:
        from tokenizers import Tokenizer as HfTokenizer

        tok = HfTokenizer.from_str(self._tok.to_str())  # its own: the flag is per object
        tok.encode_special_tokens = True
        return tok

    def decode(self, ids: Sequence[int], skip_special_tokens: bool) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def id_to_token(self, token_id: int) -> str | None:
        return self._tok.id_to_token(token_id)

    def token_bytes(self, token_id: int) -> bytes:
        piece = self._tok.id_to_token(token_id)
        return b"" if piece is None else self._piece_bytes(piece, token_id in self._added)

    def to_json_str(self) -> str:
        """The tokenizer.json text (for llguidance, engine/structured/ll_tokenizer.py)."""
        return self._tok.to_str()

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    @property
    def id_bound(self) -> int:
        """1 + the largest id (ids may be sparse: above vocab_size - 1)."""
        return 1 + max(self._tok.get_vocab(with_added_tokens=True).values(), default=-1)

    @property
    def special_ids(self) -> frozenset[int]:
        return self._special


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise TokenizerLoadError(f"{path}: invalid JSON: {exc}") from exc
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    """tokenizer_config.json writes special tokens as a string or {"content": ...}."""
    if isinstance(value, Mapping):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _ids(value: Any) -> list[int]:
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int) and not isinstance(v, bool)]
    return []


# the most a request's own chat template (--trust-request-chat-template) may take to render
REQUEST_TEMPLATE_SECONDS = 5.0


class Tokenizer:
    """Encode/decode text and chat messages for one model. Immutable after loading."""

    def __init__(self, backend: Backend, chat_template: str | None, bos_token_id: int | None,
                 eos_token_ids: frozenset[int], chat_encoder: Any = None,
                 eos_token: str | None = None) -> None:
        self.backend = backend
        self.chat_template = chat_template
        self.bos_token_id = bos_token_id
        self.eos_token_ids = eos_token_ids
        self._chat_encoder = chat_encoder  # mistral-common encoder when there is no template
        # The content shape the template takes (engine/text/content_format.py); the
        # mistral-common encoding takes the parts themselves (chat_template.PARTS).
        self.content_format = detect_content_format(chat_template)
        if chat_template is not None or chat_encoder is not None:
            log.info("chat messages: %s content (%s)", self.content_format,
                     "chat template" if chat_template is not None else "mistral-common")
        # Text of the template's ``eos_token``: tokenizer_config's, else the lowest EOS id's.
        first_eos = min(eos_token_ids) if eos_token_ids else None
        self.eos_token = eos_token or self._text_of(first_eos) or ""
        # the tokenizer's own EOS (vLLM's tokenizer.eos_token_id); the others, from
        # generation_config or config, end a request as stop token ids do (stop_reason: id)
        own = self.token_to_id(self.eos_token) if self.eos_token else None
        self.primary_eos_id = own if own in eos_token_ids else first_eos
        self.bos_token = self._text_of(bos_token_id) or ""

    @classmethod
    def from_dir(cls, model_dir: str | Path, mode: str = "auto",
                 chat_template: str | None = None, content_format: str = "auto"
                 ) -> Tokenizer:
        """``mode`` (vLLM's --tokenizer-mode): auto = tokenizer.json (with the Jinja chat
        template) where there is one, else tekken.json; hf = tokenizer.json; mistral =
        tekken.json, chats encoded by mistral-common (a Jinja template is not used).
        ``chat_template`` (vLLM's --chat-template, its text): replaces the directory's.
        ``content_format`` (vLLM's --chat-template-content-format): "string" or "openai"
        message contents for the template, "auto" = detected from the template."""
        if mode not in TOKENIZER_MODES:
            raise TokenizerLoadError(f"tokenizer mode {mode!r} not in {TOKENIZER_MODES}")
        if chat_template is not None and mode == "mistral":
            raise TokenizerLoadError("--chat-template: --tokenizer-mode mistral encodes "
                                     "chats with mistral-common, which takes no template")
        model_dir = Path(model_dir)
        tok_cfg = _read_json(model_dir / "tokenizer_config.json")
        chat_encoder = None
        hf, tekken = model_dir / "tokenizer.json", model_dir / "tekken.json"
        wanted = {"hf": hf, "mistral": tekken}.get(mode)
        if wanted is not None and not wanted.is_file():
            raise TokenizerLoadError(f"{wanted}: missing (--tokenizer-mode {mode})")
        if mode != "mistral" and hf.is_file():
            backend: Backend = HfBackend(hf)
        elif tekken.is_file():
            from engine.text.tokenizer_tekken import TekkenBackend

            backend = TekkenBackend(tekken)
            chat_encoder = backend.chat_encoder
        else:
            raise TokenizerLoadError(f"{model_dir}: no tokenizer.json or tekken.json")
        template = (None if mode == "mistral" else
                    chat_template if chat_template is not None else
                    load_chat_template(model_dir))
        if template is not None:  # a syntax error fails here, not in every chat request
            try:
                template_reads(template)
            except ChatTemplateError as exc:
                source = ("--chat-template" if chat_template is not None else
                          model_dir / "chat_template.jinja"
                          if (model_dir / "chat_template.jinja").is_file()
                          else model_dir / "tokenizer_config.json")
                raise TokenizerLoadError(f"{source}: {exc}") from None
        bos, eos = cls._special_ids(model_dir, tok_cfg, backend)
        tok = cls(backend, template, bos, eos, None if template else chat_encoder,
                  _token_text(tok_cfg.get("eos_token")))
        if content_format != "auto":
            if content_format not in CONTENT_FORMATS:
                raise TokenizerLoadError(f"chat template content format {content_format!r} "
                                         f"not in {CONTENT_FORMATS}")
            tok.content_format = content_format
        return tok

    @staticmethod
    def _special_ids(model_dir: Path, tok_cfg: dict, backend: Backend
                     ) -> tuple[int | None, frozenset[int]]:
        gen = _read_json(model_dir / "generation_config.json")
        cfg = _read_json(model_dir / "config.json")
        text_cfg = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}
        eos = set(_ids(gen.get("eos_token_id")) + _ids(cfg.get("eos_token_id"))
                  + _ids(text_cfg.get("eos_token_id")))
        bos_ids = _ids(gen.get("bos_token_id")) or _ids(cfg.get("bos_token_id"))
        for key, target in (("eos_token", eos), ("bos_token", None)):
            text = _token_text(tok_cfg.get(key))
            tid = backend.token_to_id(text) if text else None
            if text and tid is None:
                log.warning("%s: %s %r is no token of the vocabulary: not used",
                            model_dir / "tokenizer_config.json", key, text)
            if tid is not None and target is not None:
                target.add(tid)
            elif tid is not None and not bos_ids:
                bos_ids = [tid]
        default_eos = getattr(backend, "default_eos_id", None)
        if default_eos is not None:
            eos.add(default_eos)
        bos = bos_ids[0] if bos_ids else getattr(backend, "default_bos_id", None)
        outside = sorted(i for i in eos if not 0 <= i < backend.vocab_size)
        if outside:
            log.warning("%s: eos_token_id %s outside the vocabulary (%d tokens): not used",
                        model_dir, outside, backend.vocab_size)
        if len(outside) == len(eos):
            log.warning("%s: no EOS token: answers end only at max_tokens, a stop string or "
                        "a stop token id", model_dir)
        return bos, frozenset(i for i in eos if 0 <= i < backend.vocab_size)

    # -- text ------------------------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Text -> ids; add_special_tokens adds what the tokenizer adds (e.g. BOS)."""
        return self.backend.encode(text, add_special_tokens)

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(ids, skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        return self.backend.vocab_size

    def check_fits(self, model_vocab_size: int) -> None:
        """TokenizerLoadError when the tokenizer has ids the model has no row for (each
        such token in a prompt would fail inside the model: a 500 per request)."""
        bound = self.backend.id_bound
        if bound > model_vocab_size:
            raise TokenizerLoadError(
                f"{self.backend.path}: ids up to {bound - 1} ({self.id_to_token(bound - 1)!r}), "
                f"but the model's vocab_size is {model_vocab_size}: that tokenizer is not "
                "this model's")

    def id_to_token(self, token_id: int) -> str:
        """The vocabulary entry (byte-level spelling, e.g. 'Ġthe')."""
        return self.backend.id_to_token(token_id) or ""

    def token_to_id(self, token: str) -> int | None:
        """The id of a special token ("[TOOL_CALLS]") or vocabulary entry; None if absent."""
        return self.backend.token_to_id(token)

    def token_bytes(self, token_id: int) -> bytes:
        """The token's own bytes (a piece of a UTF-8 character stays that piece: the
        bytes of consecutive tokens join into the text); a special token's text."""
        return self.backend.token_bytes(token_id)

    @cached_property
    def max_token_bytes(self) -> int:
        """The most bytes one token stands for (its own bytes; a special token's text): a
        text of N bytes encodes to at least N / max_token_bytes tokens."""
        return max((len(self.backend.token_bytes(i)) for i in range(self.backend.id_bound)),
                   default=1) or 1

    def token_to_text(self, token_id: int) -> str:
        """The token's own text, for logprobs (a partial UTF-8 byte shows as U+FFFD)."""
        return self.backend.decode([token_id], False)

    def is_special(self, token_id: int) -> bool:
        return token_id in self.backend.special_ids

    def _text_of(self, token_id: int | None) -> str | None:
        return None if token_id is None else self.backend.id_to_token(token_id)

    # -- chat ------------------------------------------------------------------------
    def apply_chat_template(self, messages: Sequence[Mapping[str, Any]],
                            add_generation_prompt: bool = True,
                            continue_final_message: bool = False,
                            template: str | None = None, **kwargs: Any) -> str:
        """The prompt text for ``messages`` (ChatTemplateError on bad input).
        ``continue_final_message``: the prompt ends inside the final (assistant) message,
        which the model then continues (no generation prompt is added). ``template``: a
        Jinja template to render with instead of the model's (a request's, vLLM's
        chat_template), its contents in the form it reads."""
        if template is None and self.chat_template is None:
            if self._chat_encoder is not None:
                return self._mistral_common(messages, kwargs.get("tools"),
                                            continue_final_message)[1]
            raise ChatTemplateError("this model has no chat template")
        specials = {"bos_token": self.bos_token, "eos_token": self.eos_token}
        source, fmt = ((self.chat_template, self.content_format) if template is None
                       else (template, detect_content_format(template)))
        text = render_chat_template(source, messages,
                                    add_generation_prompt and not continue_final_message,
                                    specials, fmt,
                                    None if template is None else REQUEST_TEMPLATE_SECONDS,
                                    **kwargs)
        return (cut_after_final_message(text, messages, fmt) if continue_final_message
                else text)

    def _mistral_common(self, messages: Sequence[Mapping[str, Any]], tools: Any,
                        continue_final_message: bool = False) -> tuple[list[int], str]:
        return self._chat_encoder(normalize_messages(messages, PARTS), tools,
                                  continue_final_message=continue_final_message)

    def encode_chat(self, messages: Sequence[Mapping[str, Any]],
                    add_generation_prompt: bool = True, continue_final_message: bool = False,
                    add_special_tokens: bool = False, template: str | None = None,
                    **kwargs: Any) -> list[int]:
        """Prompt ids for ``messages``; BOS comes from the template only (never doubled),
        unless ``add_special_tokens`` asks for the tokenizer's own on top of it (vLLM's
        chat option: what encode adds to the rendered text, e.g. a second BOS).
        ``template``: as apply_chat_template's."""
        if template is None and self.chat_template is None and self._chat_encoder is not None:
            ids = self._mistral_common(messages, kwargs.get("tools"),
                                       continue_final_message)[0]
            return self.encode("", True) + ids if add_special_tokens else ids
        lit = Literals(self._control)
        text = self.apply_chat_template(lit.hide(messages), add_generation_prompt,
                                        continue_final_message, template, **lit.hide(kwargs))
        if not lit.used:
            return self.encode(text, add_special_tokens=add_special_tokens)
        return ((self.encode("", True) if add_special_tokens else [])
                + lit.encode(text, self.backend))

    @cached_property
    def _control(self) -> Any:
        """The pattern of the vocabulary's special-token strings (engine/text/literals.py)."""
        return control_strings([self.backend.id_to_token(i) or ""
                                for i in self.backend.special_ids])
