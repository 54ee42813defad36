"""Server settings: every field is also an ``FP8SERVE_<NAME>`` environment variable
(``FP8SERVE_API_KEYS`` takes a comma-separated list or a JSON list). CLI flags of
``fp8serve serve`` override the environment."""

from __future__ import annotations

import argparse
import ipaddress
import json
import logging
from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, SecretStr, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from engine.config_flags import threads_problem

log = logging.getLogger(__name__)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="FP8SERVE_", extra="ignore", frozen=True)

    model: Path | None = None  # checkpoint dir; None = the demo model
    # the model's ids in the API (vLLM's aliases): the first is reported and labels the
    # metrics, a request may name any; none: the model directory's name
    served_model_name: Annotated[tuple[str, ...], NoDecode] = ()
    host: str = "127.0.0.1"
    port: int = Field(8000, ge=0, le=65535)
    api_keys: Annotated[tuple[str, ...], NoDecode] = ()
    max_num_seqs: int = Field(16, ge=1)
    max_model_len: int = Field(4096, ge=2)
    max_num_batched_tokens: int = Field(512, ge=1)
    max_prefill_tokens_with_decodes: int = Field(0, ge=0)  # 0: the rest of the step
    kv_cache_gib: float = Field(1.0, gt=0)
    # vLLM's --stream-interval: streamed outputs go out every N tokens (the first at
    # once, the last when the answer ends); requests may set their own
    stream_interval: int = Field(1, ge=1)
    max_queue: int | None = Field(256, ge=0)  # waiting requests beyond this: 429
    # a request body beyond this is a 413 before it is read (0: no limit); room for
    # limit_mm_per_prompt base64 images of max_media_bytes
    max_request_body_mib: int = Field(128, ge=0)
    request_timeout: float | None = Field(600.0, gt=0)  # seconds per request
    drain_timeout: float = Field(30.0, ge=0)  # SIGTERM grace period for in-flight requests
    threads: int | None = Field(None, ge=1)
    heap_retain_mib: int = Field(256, ge=0)  # freed step buffers kept; 0 = libc defaults
    enable_prefix_caching: bool = True  # share computed KV blocks of common prefixes
    # fcfs; priority: a request's priority (lower first) orders the queue and preemption
    scheduling_policy: Literal["fcfs", "priority"] = "fcfs"
    kernel: str | None = None
    disabled_kernels: Annotated[tuple[str, ...], NoDecode] = ()
    # AMX hosts: generated rows on avx512_w8a16 beside prompt rows on the tiles (on), every
    # row on the tiles (off); auto: on with max_num_seqs 1 and no speculative decoding
    # (engine/config.py ROWS_BY_ROLE)
    rows_by_role: Literal["auto", "on", "off"] = "auto"
    # the lm_head's dtype: auto = the checkpoint's; fp8 quantizes a bf16 head at load
    lm_head_dtype: Literal["auto", "bf16", "fp8"] = "auto"
    # the KV cache's element type: auto = bf16; fp8 = e4m3 with per-row fp32 scales
    kv_cache_dtype: Literal["auto", "bf16", "fp8"] = "auto"
    # vLLM's --logprobs-mode (engine/sampler.py): what a reported logprob is
    logprobs_mode: Literal["processed_logprobs", "raw_logprobs", "processed_logits",
                           "raw_logits"] = "processed_logprobs"
    # auto: generation_config.json's temperature, top_p, top_k, min_p, repetition_penalty
    # and max_new_tokens are the defaults for requests that leave them out; none (vLLM's
    # word: vllm): ignore it; a directory: the generation_config.json there
    generation_config: str = "auto"
    # vLLM's --override-generation-config: JSON of those keys, set over the defaults
    override_generation_config: str | None = None
    # chat outputs -> tool_calls / reasoning_content (service/tool_calls/select.py)
    tool_call_parser: Literal["auto", "mistral", "hermes", "none"] = "auto"
    # vLLM's: tool_choice auto is always served here when a tool-call parser reads the
    # outputs; the flag is taken so that vLLM command lines run (with parser none: error)
    enable_auto_tool_choice: bool = False
    # vLLM's --tokenizer-mode: auto = tokenizer.json and its Jinja chat template where
    # there is one, else tekken.json; hf = tokenizer.json; mistral = tekken.json with
    # mistral-common's chat encoding
    tokenizer_mode: Literal["auto", "hf", "mistral"] = "auto"
    # vLLM's --chat-template: a file's path or the template itself, instead of the
    # checkpoint's (chat_template.jinja / tokenizer_config.json)
    chat_template: str | None = None
    # vLLM's --chat-template-content-format: message contents as strings or as OpenAI's
    # part lists for the template; auto = what the template reads (detected)
    chat_template_content_format: Literal["auto", "string", "openai"] = "auto"
    # vLLM's: requests may bring their own chat_template (rendered in Jinja's sandbox)
    trust_request_chat_template: bool = False
    # vLLM's --config-format / --load-format: the layout read from a directory that holds
    # both (published repos do): mistral = params.json + consolidated.safetensors; hf /
    # safetensors = config.json + model*.safetensors; auto = the Hugging Face one there
    config_format: Literal["auto", "hf", "mistral"] = "auto"
    # vLLM flags taken at the values that describe this server, so that vLLM command
    # lines run: activations are bf16 (auto, bfloat16); one process (tensor parallel 1);
    # no checkpoint code is ever run (trust_remote_code changes nothing)
    dtype: Literal["auto", "bfloat16"] = "auto"
    tensor_parallel_size: int = Field(1, ge=1, le=1)
    trust_remote_code: bool = False
    # ... steps run eagerly (no graph capture), prompts are prefilled in chunks, KV blocks
    # hold 16 tokens, requests ask for up to 20 logprobs, stats are on /metrics (no
    # periodic stats lines)
    enforce_eager: bool = False
    # vLLM's --quantization: fp8 = the checkpoint's FP8 weights, served as they are (a
    # bf16 checkpoint with it fails at startup: weights are not quantized at load here)
    quantization: Literal["fp8"] | None = None
    enable_chunked_prefill: bool = True
    block_size: int = Field(16, ge=16, le=16)
    max_logprobs: int = Field(20, ge=20, le=20)
    disable_log_stats: bool = False
    # uvicorn's own log level (None: the process's)
    uvicorn_log_level: Literal["critical", "error", "warning", "info", "debug",
                               "trace"] | None = None
    # vLLM's: no line per HTTP request in the log (uvicorn's access log); request
    # contents are never logged here, which is what --disable-log-requests asks for
    disable_uvicorn_access_log: bool = False
    disable_log_requests: bool = False
    load_format: Literal["auto", "safetensors", "mistral"] = "auto"
    reasoning_parser: Literal["auto", "mistral", "think", "think-open", "none"] = "auto"
    # image input (engine/vision, service/images.py, service/media.py): images per prompt
    # (0: the vision tower is not loaded, text-only serving), longest edge after resizing
    # (None: the model's image_size), http(s) hosts images may be fetched from (none by
    # default), fetch timeout, byte cap per image, the directory file:// URLs may read
    limit_mm_per_prompt: int = Field(4, ge=0)
    max_image_size: int | None = Field(None, ge=28)
    allowed_media_domains: Annotated[tuple[str, ...], NoDecode] = ()
    # CORS (vLLM's flags): origins a browser page may call from (JSON list or commas;
    # none by default: no CORS headers), and for them credentials, methods, headers
    allowed_origins: Annotated[tuple[str, ...], NoDecode] = ()
    allow_credentials: bool = False
    allowed_methods: Annotated[tuple[str, ...], NoDecode] = ("*",)
    allowed_headers: Annotated[tuple[str, ...], NoDecode] = ("*",)
    media_fetch_timeout: float = Field(5.0, gt=0)
    max_media_bytes: int = Field(20 * 2**20, ge=1)
    allowed_local_media_path: Path | None = None
    image_cache_mib: int = Field(512, ge=0)  # encoded images kept for reuse (LRU)
    # the Responses API's stored responses (service/store/responses.py), LRU, per API
    # key, in this process's memory; 0: nothing is stored (store: true is a 400)
    responses_store_mib: int = Field(256, ge=0)
    # the Conversations API's conversations (service/store/conversations.py), LRU, per
    # API key, in this process's memory; 0: conversations are not served
    conversations_store_mib: int = Field(256, ge=0)
    # speculative decoding (engine/spec/config.py): vLLM's JSON object; None = off
    speculative_config: str | None = None
    # vLLM's --seed: where the random state of requests without a seed starts
    seed: int | None = None
    # the HMAC key of Anthropic thinking-block signatures (service/translate/signature.py)
    # and the secret of Responses reasoning items' encrypted_content
    # (service/translate/sealed.py); unset: a random key per process, so neither outlives a
    # restart. The
    # environment only, no CLI flag: a flag's value shows in the process list
    thinking_signature_key: SecretStr | None = None
    # torch intra-op threads of the one thread that encodes images (None: --threads);
    # at most the CPUs this process may use (engine/vision/encoder_thread.py)
    vision_encoder_threads: int | None = Field(None, ge=1)

    @field_validator("api_keys", "disabled_kernels", "allowed_media_domains",
                     "served_model_name", "allowed_origins", "allowed_methods",
                     "allowed_headers", mode="before")
    @classmethod
    def _split(cls, v: object) -> object:
        if isinstance(v, str):
            v = v.strip()
            if v.startswith("["):
                try:
                    return tuple(json.loads(v))
                except ValueError as exc:
                    raise ValueError(f"a JSON list, or values separated by commas: "
                                     f"{exc}") from None
            return tuple(p.strip() for p in v.split(",") if p.strip())
        return v

    @field_validator("max_model_len", "max_num_batched_tokens", "limit_mm_per_prompt",
                     mode="before")
    @classmethod
    def _flag_forms(cls, v: object, info: ValidationInfo) -> object:
        """The environment takes what the flag takes (engine/config_flags.py): token counts
        with units (FP8SERVE_MAX_MODEL_LEN=32k), image=N or {"image": N} for
        FP8SERVE_LIMIT_MM_PER_PROMPT; a plain integer as it is."""
        if not isinstance(v, str) or v.strip().isdigit():
            return v
        from engine.config_flags import human_int, parse_mm_limit

        parse = parse_mm_limit if info.field_name == "limit_mm_per_prompt" else human_int
        try:
            return parse(v)
        except argparse.ArgumentTypeError as exc:
            raise ValueError(str(exc)) from None

    @model_validator(mode="after")
    def _cors_needs_origins(self) -> Settings:
        """The CORS flags describe answers to allowed origins: without one they would be
        ignored, so they are refused."""
        if self.allowed_origins:
            return self
        given = [f for f, on in (("--allow-credentials", self.allow_credentials),
                                 ("--allowed-methods", self.allowed_methods != ("*",)),
                                 ("--allowed-headers", self.allowed_headers != ("*",))) if on]
        if given:
            raise ValueError(f"{', '.join(given)}: CORS settings for --allowed-origins, "
                             "which is not set")
        return self

    @field_validator("enable_chunked_prefill")
    @classmethod
    def _chunked_prefill(cls, on: bool) -> bool:
        if not on:
            raise ValueError("prompts are always prefilled in chunks here, each step taking "
                             "up to --max-num-batched-tokens of them")
        return on

    @field_validator("generation_config")
    @classmethod
    def _generation_config(cls, v: str) -> str:
        if v in ("auto", "none", "vllm") or (Path(v) / "generation_config.json").is_file():
            return v
        if Path(v).is_dir():  # the defaults it was given for would be none, silently
            raise ValueError(f"{v} holds no generation_config.json")
        raise ValueError(f"{v!r} is not auto, vllm, none or a directory")

    @field_validator("override_generation_config")
    @classmethod
    def _generation_overrides(cls, v: str | None) -> str | None:
        if v is None:
            return None
        from engine.checkpoint.generation import SAMPLING_KEYS

        try:
            values = json.loads(v)
        except ValueError as exc:
            raise ValueError(f"not JSON: {exc}") from None
        if not isinstance(values, dict):
            raise ValueError("a JSON object of generation_config keys")
        unknown = sorted(set(values) - set(SAMPLING_KEYS))
        if unknown:
            raise ValueError(f"{', '.join(unknown)}: not sampling defaults (take "
                             f"{', '.join(SAMPLING_KEYS)})")
        return v

    @field_validator("speculative_config")
    @classmethod
    def _spec_config(cls, v: str | None) -> str | None:
        from engine.spec.config import SpeculativeConfig

        parsed = SpeculativeConfig.parse(v)  # ConfigError (a ValueError) names the key
        return None if parsed is None else parsed.to_json()

    @field_validator("allowed_local_media_path")
    @classmethod
    def _media_dir_exists(cls, v: Path | None) -> Path | None:
        if v is not None and not v.is_dir():
            raise ValueError(f"{v} is not a directory")
        return v

    @field_validator("threads", "vision_encoder_threads")
    @classmethod
    def _threads_fit(cls, v: int | None) -> int | None:
        problem = None if v is None else threads_problem(v)
        if problem is not None:
            raise ValueError(problem)
        return v

    @field_validator("api_keys")
    @classmethod
    def _keys_not_blank(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if any(len(k) < 1 or k.strip() != k for k in v):
            raise ValueError("API keys must be non-empty and without surrounding spaces")
        return v

    @field_validator("host")
    @classmethod
    def _host_given(cls, v: str) -> str:
        """An empty host bound every interface (as 0.0.0.0 does), which an empty
        FP8SERVE_HOST hardly means."""
        if not v.strip():
            raise ValueError("empty: 127.0.0.1 listens on this machine only, 0.0.0.0 (or "
                             "::) on every interface")
        return v

    @field_validator("served_model_name")
    @classmethod
    def _names_distinct(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        if any(not n.strip() or n.strip() != n for n in v) or len(set(v)) != len(v):
            raise ValueError("served model names must be distinct, non-empty and without "
                             "surrounding spaces")
        return v

    @field_validator("thinking_signature_key", mode="before")
    @classmethod
    def _empty_key_is_none(cls, v: object) -> object:
        """An empty value (compose's ``${FP8SERVE_THINKING_SIGNATURE_KEY:-}`` when the shell
        sets none) is no key: a random one per process, as without the variable."""
        return None if v == "" else v

    @field_validator("thinking_signature_key")
    @classmethod
    def _key_long_enough(cls, v: SecretStr | None) -> SecretStr | None:
        if v is not None and len(v.get_secret_value()) < 16:
            raise ValueError("the thinking signature key must have at least 16 characters")
        return v

    @model_validator(mode="after")
    def _formats_agree(self) -> Settings:
        native = {self.config_format == "mistral", self.load_format == "mistral"}
        if native == {True, False} and "auto" not in (self.config_format, self.load_format):
            raise ValueError(f"--config-format {self.config_format} and --load-format "
                             f"{self.load_format} name different layouts (mistral goes "
                             "with mistral, hf with safetensors)")
        if self.enable_auto_tool_choice and self.tool_call_parser == "none":
            raise ValueError("--enable-auto-tool-choice needs a tool-call parser "
                             "(--tool-call-parser auto, mistral or hermes)")
        return self

    @property
    def checkpoint_layout(self) -> str | None:
        """The layout --config-format / --load-format name ("hf", "native"); None: the
        one the directory's files decide."""
        formats = {self.config_format, self.load_format} - {"auto"}
        if not formats:
            return None
        return "native" if "mistral" in formats else "hf"

    @model_validator(mode="after")
    def _warn_open_bind(self) -> Settings:
        if not self.api_keys and not _is_loopback(self.host):
            log.warning("listening on %s without an API key: anyone who can reach this "
                        "address can use the model (set FP8SERVE_API_KEYS)", self.host)
        return self


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
