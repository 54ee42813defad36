"""The sampling fields /v1/completions and /v1/chat/completions share, stream options
and vLLM's structured_outputs."""

from __future__ import annotations

from typing import Annotated, Any, ClassVar

from pydantic import (
    ConfigDict,
    Field,
    model_validator,
)
from pydantic.config import JsonDict

from engine.checkpoint.generation import SamplingDefaults
from service import unsupported
from service.schemas.base import (
    MAX_BAD_WORDS,
    LogitBias,
    StopList,
    StopStr,
    TokenId,
    _Body,
    _field_error,
)


class StreamOptions(_Body):
    openai_endpoint: ClassVar[str | None] = unsupported.STREAM_OPTIONS
    include_usage: bool = False
    # vLLM's: every chunk carries the usage so far (its choice's tokens); needs include_usage
    continuous_usage_stats: bool = False

    @model_validator(mode="after")
    def _continuous_needs_usage(self) -> StreamOptions:
        if self.continuous_usage_stats and not self.include_usage:
            raise _field_error(type(self).__name__, "continuous_usage_stats", "value_error",
                               "continuous_usage_stats needs include_usage true",
                               self.continuous_usage_stats)
        return self


# a declared field the server refuses when set (the published schema says so, and the
# 400 names the field): the request model reads it so that it is never ignored
HANDLING_KEY = "x-fp8serve-handling"
REFUSED_UNLESS_NULL: JsonDict = {HANDLING_KEY: "not implemented: 400 unless `null`"}


class StructuredOutputs(_Body):
    """vLLM's ``structured_outputs`` (``StructuredOutputsParams``): exactly one constraint
    (json, regex, choice, grammar, json_object, structural_tag) and the JSON
    options (engine/structured/outputs.py). Unknown keys are a 400, not ignored."""

    model_config = ConfigDict(extra="forbid")
    json_: dict[str, Any] | str | None = Field(None, alias="json")
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    json_object: bool | None = None
    structural_tag: str | dict[str, Any] | None = None
    whitespace_pattern: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    disable_fallback: bool = False

    def as_params(self) -> dict[str, Any]:
        """The fields that were set, by their JSON names."""
        return self.model_dump(by_alias=True, exclude_none=True)


# Request fields a model's generation_config.json can give defaults for.
DISTRIBUTION_FIELDS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
NO_DEFAULTS = SamplingDefaults()


class _Sampling(_Body):
    """Fields shared by /v1/completions and /v1/chat/completions."""

    model: str | None = None
    temperature: float = Field(1.0, ge=0, le=2)  # OpenAI's range (vLLM's too)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)
    min_p: float = Field(0.0, ge=0, le=1)
    # any integer, modulo 2**64 (engine/sampler.py make_generator); -1: none, as in vLLM
    seed: int | None = None
    n: int = Field(1, ge=1, le=32)
    stop: StopStr | StopList | None = None
    stop_token_ids: list[TokenId] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = Field(0.0, ge=-2, le=2)
    frequency_penalty: float = Field(0.0, ge=-2, le=2)
    repetition_penalty: float = Field(1.0, gt=0)
    ignore_eos: bool = False
    min_tokens: int = Field(0, ge=0)
    logit_bias: LogitBias | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    user: str | None = None
    # vLLM's: requests with different salts never share prefix-cache blocks
    cache_salt: str | None = Field(None, min_length=1)
    # vLLM's: lower is served first under --scheduling-policy priority; 0 otherwise
    priority: int = 0
    # vLLM's: streamed chunks every N tokens (the first token at once; None: the
    # server's --stream-interval)
    stream_interval: int | None = Field(None, ge=1)
    # vLLM's: the prompt's and each choice's token ids in the answer (and its chunks)
    return_token_ids: bool = False
    # vLLM's: logprobs name each token "token_id:<id>" (ids a client can map back)
    return_tokens_as_token_ids: bool = False
    # vLLM's: the last N prompt tokens only (-1: the last max_model_len)
    truncate_prompt_tokens: int | None = Field(None, ge=-1)
    # vLLM's: each prompt token's logprob and rank, with this many alternatives
    prompt_logprobs: int | None = Field(None, ge=0, le=20)
    # vLLM's token filters: sample only these ids; never complete these words
    allowed_token_ids: list[TokenId] | None = Field(None, min_length=1)
    bad_words: Annotated[list[StopStr], Field(max_length=MAX_BAD_WORDS)] | None = None
    # vLLM's output constraint (service/structured_outputs.py), and the fields it replaced
    structured_outputs: StructuredOutputs | None = None
    guided_json: dict[str, Any] | str | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_whitespace_pattern: str | None = None
    guided_decoding_backend: str | None = None
    structural_tag: str | dict[str, Any] | None = None
    # vLLM's beam search (service/beam_search.py): n beams, ranked by cumulative logprob
    # / length ** length_penalty
    use_beam_search: bool = False
    length_penalty: float = 1.0

    def sampling_kwargs(self, defaults: SamplingDefaults = NO_DEFAULTS) -> dict[str, Any]:
        """SamplingParams keyword arguments. A distribution field the request leaves out
        takes the model's default (generation_config.json) when it has one."""
        dist = {name: getattr(self, name) for name in DISTRIBUTION_FIELDS}
        for name, value in defaults.as_dict().items():
            if name in dist and name not in self.model_fields_set:
                dist[name] = value
        return dict(
            **dist, stop=self.stop, stop_token_ids=self.stop_token_ids or (),
            presence_penalty=self.presence_penalty,
            frequency_penalty=self.frequency_penalty, ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
            logit_bias={int(k): v for k, v in (self.logit_bias or {}).items()},
            include_stop_str_in_output=self.include_stop_str_in_output,
            skip_special_tokens=self.skip_special_tokens,
            allowed_token_ids=self.allowed_token_ids,
        )

    @model_validator(mode="after")
    def _stream_options_need_stream(self) -> _Sampling:
        if self.stream_options is not None and not self.stream:  # OpenAI's rule (vLLM's)
            raise _field_error(type(self).__name__, "stream_options", "value_error",
                               "stream_options is only allowed when stream is true",
                               self.stream_options.model_dump())
        return self

    @model_validator(mode="after")
    def _length_penalty_needs_beams(self) -> _Sampling:
        # it ranks beams: a sampled request has none, so another value would go unused
        if self.length_penalty != 1 and not self.use_beam_search:
            raise _field_error(type(self).__name__, "length_penalty", "value_error",
                               "length_penalty ranks beams: it needs use_beam_search true "
                               "(or leave it out)", self.length_penalty)
        return self

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)

    @property
    def continuous_usage(self) -> bool:
        """vLLM's stream_options.continuous_usage_stats: usage on every chunk."""
        return bool(self.stream_options and self.stream_options.continuous_usage_stats)
