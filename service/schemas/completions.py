"""The body of /v1/completions and its prompt forms."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import (
    BeforeValidator,
    ConfigDict,
    Field,
    model_validator,
)
from pydantic.config import JsonDict
from pydantic_core import PydanticCustomError

from service import unsupported
from service.schemas.base import (
    SCORING_TOKENS,
    TokenIds,
    _field_error,
    with_rules,
)
from service.schemas.formats import (
    ResponseFormat,
)
from service.schemas.sampling import (
    _Sampling,
)

PROMPT_FORMS = "a string, a list of strings, a list of token ids or a list of token-id lists"


def _json_kind(value: Any) -> str:
    """What a prompt (or one of its items) is, in the words of PROMPT_FORMS."""
    kinds = ((bool, "a boolean"), (str, "a string"), (int, "a token id"), (float, "a number"),
             (list, "a list"), (dict, "an object"))
    return next((word for t, word in kinds if isinstance(value, t)), "null")


def check_prompt_form(prompt: Any) -> Any:
    """A prompt of one of OpenAI's four forms, else a 400 that says which item breaks it
    (a union's error would name one form: "should be a valid string" for [[1], 2])."""
    if isinstance(prompt, str) or (isinstance(prompt, list) and not prompt):
        return prompt  # an empty list: the schema's own "at least 1 item"
    if not isinstance(prompt, list):
        raise PydanticCustomError("value_error", "got {kind}; send {forms}",
                                  {"kind": _json_kind(prompt), "forms": PROMPT_FORMS})
    first = _json_kind(prompt[0])
    for i, item in enumerate(prompt):
        kind = _json_kind(item)
        if kind not in ("a string", "a token id", "a list") or kind != first:
            where = f" where item 0 is {first}" if kind != first else ""
            raise PydanticCustomError("value_error", "item {i} is {kind}{where}; send {forms}",
                                      {"i": i, "kind": kind, "where": where,
                                       "forms": PROMPT_FORMS})
    return prompt


# max_tokens 0 answers with the prompt alone: only with echo true
_NO_OUTPUT_NEEDS_ECHO: JsonDict = {
    "if": {"not": {"required": ["echo"], "properties": {"echo": {"const": True}}}},
    "then": {"properties": {"max_tokens": {"not": {"const": 0}}}}}


class CompletionRequest(_Sampling):
    model_config = ConfigDict(json_schema_extra=with_rules(_NO_OUTPUT_NEEDS_ECHO))
    openai_endpoint: ClassVar[str | None] = unsupported.COMPLETIONS
    # text may be empty, as in OpenAI's API: it prompts with the start of a document
    # (service/prompts.py)
    prompt: Annotated[str | Annotated[list[str], Field(min_length=1)] | TokenIds
                      | Annotated[list[TokenIds], Field(min_length=1)],
                      BeforeValidator(check_prompt_form)]
    # 0 with echo: the prompt alone (service/prompt_echo.py)
    max_tokens: int | None = Field(16, ge=0)
    logprobs: int | None = Field(None, ge=0, le=20)
    echo: bool = False
    # OpenAI's: best_of candidates per prompt, the n with the highest sum of their tokens'
    # logprobs returned (not with stream)
    best_of: int | None = Field(None, ge=1, le=32)
    # vLLM's extension: the output as JSON (service/structured_outputs.py)
    response_format: ResponseFormat | None = None
    # vLLM's: BOS (and the like) before a text prompt
    add_special_tokens: bool = True

    @model_validator(mode="after")
    def _no_output_needs_echo(self) -> CompletionRequest:
        if self.max_tokens == 0 and not self.echo:  # vLLM's rule: nothing to answer
            raise _field_error(type(self).__name__, "max_tokens", "value_error",
                               "max_tokens 0 answers with the prompt alone: it needs echo "
                               "true", self.max_tokens)
        if self.max_tokens == 0 and self.min_tokens:  # not the scoring token's 1
            raise _field_error(type(self).__name__, "min_tokens", "value_error",
                               f"min_tokens {self.min_tokens} exceeds max_tokens 0",
                               self.min_tokens)
        return self

    @property
    def prompt_only(self) -> bool:
        """max_tokens 0 with echo: the answer is the prompt (service/prompt_echo.py)."""
        return self.max_tokens == 0

    def output_limit(self, default: int | None) -> int | None:
        """max_tokens as sent (0: the one token that scores the prompt, dropped from the
        answer); left out: the model's default, else OpenAI's 16."""
        if self.prompt_only:
            return SCORING_TOKENS
        if "max_tokens" in self.model_fields_set or default is None:
            return self.max_tokens
        return default
