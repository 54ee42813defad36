"""`fp8serve serve`: the OpenAI-compatible server under uvicorn.

Every flag is also an FP8SERVE_* environment variable (service/settings.py); flags win.
SIGTERM / Ctrl-C drain: /health turns 503 ("draining"), new requests get 503, in-flight
requests get up to --drain-timeout seconds to finish, then the server exits. A second
signal exits at once. A SIGTERM while the model loads exits at once.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import Any

from cli.kernels import add_kernel_args, overrides_from_args
from cli.main import CliError
from cli.serve_server import DrainingServer, uvicorn_config
from cli.serve_startup import _fit_max_model_len, _load_backend, check_bind, exit_on_sigterm
from engine.config import ROWS_BY_ROLE
from engine.config_flags import (
    add_kv_cache_dtype_arg,
    add_lm_head_arg,
    human_int,
    parse_mm_limit,
)

FLAGS: tuple[tuple[str, type, str], ...] = (
    ("--host", str, "bind address (default 127.0.0.1; 0.0.0.0 for every interface; empty "
                     "is refused)"),
    ("--port", int, "port (default 8000; 0 = any free port)"),
    ("--max-num-seqs", int, "sequences decoded together (default 16)"),
    ("--max-model-len", human_int, "prompt + output tokens per request (default 4096, or the "
                                   "checkpoint's max_position_embeddings where smaller; "
                                   "32k = 32000, 32K = 32768); above the checkpoint's "
                                   "max_position_embeddings the server starts with a warning "
                                   "(vLLM refuses unless VLLM_ALLOW_LONG_MAX_MODEL_LEN=1)"),
    ("--max-num-batched-tokens", human_int, "tokens per engine step, prefill chunks (512)"),
    ("--max-prefill-tokens-with-decodes", int,
     "prefill tokens in a step that also decodes (default 0: the rest of the step "
     "budget); a cap such as 128 bounds the stall a new prompt causes to running streams "
     "(ITL p99) and shortens TTFT under load, for some throughput"),
    ("--kv-cache-gib", float, "KV cache size in GiB, preallocated (default 1.0)"),
    ("--stream-interval", int, "streamed outputs go out every N tokens (the first at once; "
                               "default 1); requests may set their own (vLLM's)"),
    ("--max-queue", int, "waiting requests before 429 (default 256)"),
    ("--max-request-body-mib", int, "request bodies beyond this many MiB are a 413 before "
                                    "they are read (default 128; 0 = no limit)"),
    ("--request-timeout", float, "seconds per request (default 600)"),
    ("--drain-timeout", float, "SIGTERM grace period for in-flight requests (30)"),
    ("--threads", int, "torch threads for the model (default: all cores)"),
    ("--heap-retain-mib", int, "freed step buffers the malloc heap keeps for the next step, "
                               "instead of unmapping them (default 256; 0 = libc defaults)"),
    ("--max-image-size", int, "longest image edge in pixels after resizing, below the "
                              "model's maximum (default: the model's image_size, 1540)"),
    ("--media-fetch-timeout", float, "seconds to fetch an http(s) image (default 5)"),
    ("--max-media-bytes", int, "bytes per image: a data URL, a fetch or a file:// read "
                              "(default 20 MiB)"),
    ("--allowed-local-media-path", Path, "directory file:// image URLs may read (default: "
                                         "file:// refused)"),
    ("--image-cache-mib", int, "encoded images kept for reuse, LRU (default 512)"),
    ("--responses-store-mib", int, "/v1/responses kept for previous_response_id and GET, "
                                   "LRU, per API key, in this process (default 256; 0: "
                                   "store nothing)"),
    ("--conversations-store-mib", int, "/v1/conversations and their items, LRU, per API "
                                       "key, in this process (default 256; 0: no "
                                       "conversations)"),
    ("--speculative-config", str, "speculative decoding, vLLM's JSON: '{\"method\": "
                                  "\"ngram\", \"num_speculative_tokens\": 4, "
                                  "\"prompt_lookup_max\": 4, \"prompt_lookup_min\": 2}' "
                                  "(default off)"),
    ("--seed", int, "where the random state of requests without a seed of their own "
                    "starts (vLLM's; default: another each start); their answers then "
                    "repeat for the same requests in the same order and batches"),
    ("--vision-encoder-threads", int, "torch threads the image encoder uses, on its own "
                                      "thread (default: --threads); fewer keep more of the "
                                      "cores for running streams while an image encodes"),
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a model over an OpenAI-compatible HTTP API")
    p.add_argument("model_dir", nargs="?", type=Path, default=None, metavar="MODEL",
                   help="checkpoint directory, as in `vllm serve MODEL` (or --model)")
    p.add_argument("--model", type=Path, default=None, metavar="DIR",
                   help="checkpoint directory (default: the demo model)")
    p.add_argument("--served-model-name", nargs="+", default=None, metavar="NAME",
                   help="model ids in the API (aliases): a request may name any, and its "
                   "answer echoes the name it used; /version and the first card of "
                   "/v1/models report the first (default: the directory name)")
    for flag, kind, text in FLAGS:
        p.add_argument(flag, type=kind, default=None, help=text,
                       metavar="N" if kind is human_int else None)
    p.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' (repeatable; FP8SERVE_API_KEYS)")
    p.add_argument("--generation-config", default=None, metavar="auto|vllm|none|DIR",
                   help="auto (default): sampling defaults from the model's "
                        "generation_config.json for fields a request leaves out; none (or "
                        "vllm, vLLM's word): ignore it; a directory: the "
                        "generation_config.json there (one without it is refused at "
                        "startup)")
    p.add_argument("--override-generation-config", default=None, metavar="JSON",
                   help="sampling defaults set over --generation-config's, e.g. "
                   "'{\"temperature\": 0.5, \"max_new_tokens\": 512}' (vLLM's; "
                   "temperature, top_p, top_k, min_p, repetition_penalty, max_new_tokens)")
    p.add_argument("--enable-prefix-caching", action=argparse.BooleanOptionalAction,
                   default=None, help="reuse the KV blocks of prompt prefixes earlier "
                   "requests computed (default on; FP8SERVE_ENABLE_PREFIX_CACHING)")
    p.add_argument("--scheduling-policy", choices=("fcfs", "priority"), default=None,
                   help="fcfs (default): first come, first served; priority: a request's "
                   "priority field (lower first, then arrival) orders the queue and which "
                   "sequence is preempted when the KV cache runs out (vLLM's)")
    p.add_argument("--rows-by-role", choices=ROWS_BY_ROLE, default=None,
                   help="on AMX hosts, decode generated rows on avx512_w8a16 and prefill "
                   "prompt rows on the tiles (on), or every row on the tiles (off); auto "
                   "(default): on only with --max-num-seqs 1 and no --speculative-config, "
                   "where each step decodes one row (AVX-512 reads it faster; the tiles "
                   "take several rows faster); other hosts run one kernel either way")
    p.add_argument("--enable-auto-tool-choice", action="store_true", default=None,
                   help="vLLM's flag: tool_choice auto is always served when a tool-call "
                   "parser reads the outputs; taken so that vLLM command lines run")
    p.add_argument("--tokenizer-mode", choices=("auto", "hf", "mistral"), default=None,
                   help="auto (default): tokenizer.json and its chat template where there "
                   "is one, else tekken.json; hf: tokenizer.json; mistral: tekken.json, "
                   "chats encoded by mistral-common (vLLM's)")
    p.add_argument("--chat-template", default=None, metavar="FILE_OR_TEMPLATE",
                   help="a Jinja chat template (a file, or the template itself) instead "
                   "of the checkpoint's (vLLM's)")
    p.add_argument("--chat-template-content-format", choices=("auto", "string", "openai"),
                   default=None, help="message contents as strings or as OpenAI's part "
                   "lists for the chat template; auto (default): what the template reads "
                   "(vLLM's)")
    p.add_argument("--trust-request-chat-template", action="store_true", default=None,
                   help="let requests bring their own chat_template (vLLM's; rendered in "
                   "Jinja's sandbox); without it such a request is a 400")
    p.add_argument("--dtype", choices=("auto", "bfloat16"), default=None,
                   help="vLLM's: activations are bf16 here (auto, bfloat16); FP8 weights "
                   "stay FP8")
    p.add_argument("--tensor-parallel-size", type=int, choices=(1,), default=None,
                   help="vLLM's: one process serves the model (1)")
    p.add_argument("--trust-remote-code", action="store_true", default=None,
                   help="vLLM's: taken, and changes nothing: no checkpoint code is run")
    p.add_argument("--disable-uvicorn-access-log", action="store_true", default=None,
                   help="no line per HTTP request in the log (vLLM's)")
    p.add_argument("--quantization", choices=("fp8",), default=None,
                   help="vLLM's: fp8, the checkpoint's FP8 weights served as they are; a "
                   "bf16 checkpoint with it fails at startup (no quantization at load)")
    p.add_argument("--enforce-eager", action="store_true", default=None,
                   help="vLLM's: every step runs eagerly here (no graph capture); taken so "
                   "that vLLM command lines run")
    p.add_argument("--enable-chunked-prefill", action=argparse.BooleanOptionalAction,
                   default=None, help="vLLM's: prompts are always prefilled in chunks of "
                   "--max-num-batched-tokens here; --no-enable-chunked-prefill is refused")
    p.add_argument("--block-size", type=int, choices=(16,), default=None,
                   help="vLLM's: KV cache blocks hold 16 tokens (16)")
    p.add_argument("--max-logprobs", type=int, choices=(20,), default=None,
                   help="vLLM's: a request may ask for up to 20 logprobs per token (20)")
    p.add_argument("--disable-log-stats", action="store_true", default=None,
                   help="vLLM's: no periodic stats lines are logged here (they are on "
                   "/metrics); taken so that vLLM command lines run")
    p.add_argument("--uvicorn-log-level", default=None,
                   choices=("critical", "error", "warning", "info", "debug", "trace"),
                   help="uvicorn's own log level (vLLM's; default: --log-level's)")
    p.add_argument("--disable-log-requests", action="store_true", default=None,
                   help="vLLM's: request contents are never logged here; taken so that "
                   "vLLM command lines run")
    p.add_argument("--config-format", choices=("auto", "hf", "mistral"), default=None,
                   help="the layout read from a directory that holds both: mistral = "
                   "params.json (with --load-format mistral: consolidated.safetensors); "
                   "hf = config.json; auto (default): hf where present (vLLM's)")
    p.add_argument("--load-format", choices=("auto", "safetensors", "mistral"), default=None,
                   help="mistral: consolidated.safetensors; safetensors: model*.safetensors; "
                   "auto (default): as --config-format, else the Hugging Face files (vLLM's)")
    p.add_argument("--tool-call-parser", choices=("auto", "mistral", "hermes", "none"),
                   default=None, help="how chat outputs become tool_calls (default auto: "
                   "mistral for [TOOL_CALLS] tokenizers, hermes for <tool_call> templates)")
    p.add_argument("--reasoning-parser", default=None,
                   choices=("auto", "mistral", "think", "think-open", "none"),
                   help="how chat outputs become reasoning_content (default auto: mistral "
                   "for [THINK] tokenizers, think for <think> templates; each prompt says "
                   "whether its answer starts inside a section)")
    p.add_argument("--limit-mm-per-prompt", type=parse_mm_limit, default=None,
                   metavar="image=N", help="images per chat prompt (default image=4); "
                   "image=0 does not load the vision tower (text-only serving)")
    p.add_argument("--allowed-origins", default=None, metavar="JSON_OR_LIST",
                   help="CORS: origins browser pages may call from, a JSON list or commas "
                   "('[\"*\"]' for any; default none: no CORS headers) (vLLM's)")
    p.add_argument("--allow-credentials", action="store_true", default=None,
                   help="CORS: allow cookies and auth headers from those origins (vLLM's)")
    p.add_argument("--allowed-methods", default=None, metavar="JSON_OR_LIST",
                   help="CORS: methods those origins may use (default all) (vLLM's)")
    p.add_argument("--allowed-headers", default=None, metavar="JSON_OR_LIST",
                   help="CORS: request headers those origins may send (default all) "
                   "(vLLM's)")
    p.add_argument("--allowed-media-domains", nargs="+", default=None, metavar="HOST",
                   help="hosts (and their subdomains) http(s) image URLs may name "
                   "(default: none, http(s) image URLs refused)")
    p.add_argument("--logprobs-mode", choices=("processed_logprobs", "raw_logprobs",
                                               "processed_logits", "raw_logits"),
                   default=None, help="what a reported logprob is (vLLM's): "
                   "processed_logprobs (default), the distribution after logit_bias, the "
                   "token filters, min_tokens and the penalties, before temperature and "
                   "top-k/top-p/min-p; raw_logprobs, the model's own (under a grammar's "
                   "mask); *_logits, the logits themselves (then best_of above n and "
                   "use_beam_search, which rank by summed logprobs, are refused)")
    add_kernel_args(p)
    add_lm_head_arg(p)
    add_kv_cache_dtype_arg(p)
    p.set_defaults(func=run)


def settings_from_args(args: argparse.Namespace) -> Any:
    from pydantic import ValidationError

    from cli.settings_errors import settings_error
    from service.settings import Settings

    given: dict[str, Any] = {}
    if hasattr(args, "kernel"):
        # unknown kernel ids named with where they were given (flag or environment),
        # before Settings merges the two
        overrides_from_args(args)
    positional = getattr(args, "model_dir", None)
    if positional is not None:
        if args.model is not None and args.model != positional:
            raise CliError(f"two models: {positional} and --model {args.model}")
        given["model"] = positional
    for name in (["model", "generation_config", "override_generation_config",
                  "enable_prefix_caching", "tool_call_parser",
                  "enable_auto_tool_choice", "tokenizer_mode", "config_format", "load_format",
                  "chat_template", "chat_template_content_format",
                  "trust_request_chat_template", "dtype", "tensor_parallel_size",
                  "trust_remote_code", "disable_uvicorn_access_log", "disable_log_requests",
                  "reasoning_parser", "lm_head_dtype", "limit_mm_per_prompt",
                  "kv_cache_dtype", "logprobs_mode", "scheduling_policy", "enforce_eager",
                  "quantization", "rows_by_role",
                  "enable_chunked_prefill", "block_size", "max_logprobs", "disable_log_stats",
                  "uvicorn_log_level", "allowed_origins", "allow_credentials",
                  "allowed_methods", "allowed_headers"]
                 + [f[0][2:].replace("-", "_") for f in FLAGS]):
        if getattr(args, name, None) is not None:
            given[name] = getattr(args, name)
    if getattr(args, "served_model_name", None):
        given["served_model_name"] = tuple(args.served_model_name)
    if getattr(args, "allowed_media_domains", None):
        given["allowed_media_domains"] = tuple(args.allowed_media_domains)
    if args.api_key:
        given["api_keys"] = tuple(args.api_key)
    if args.kernel:
        given["kernel"] = args.kernel
    if args.disable_kernel:
        given["disabled_kernels"] = ",".join(args.disable_kernel)
    try:
        return Settings(**given)
    except ValidationError as exc:
        raise CliError(settings_error(exc, given)) from None


def run(args: argparse.Namespace) -> int:
    with exit_on_sigterm():  # until uvicorn's handlers drain
        from service.app import create_app

        settings = settings_from_args(args)
        if settings.model is not None and not settings.model.is_dir():
            why = "not a directory" if settings.model.exists() else "does not exist"
            raise CliError(f"--model {settings.model}: {why}")
        check_bind(settings.host, settings.port)
        settings = _fit_max_model_len(settings)
        backend = _load_backend(settings)
    app = create_app(settings, load_backend=lambda _settings: backend)
    server = DrainingServer(uvicorn_config(app, settings), app.state.serving,
                            settings.drain_timeout)
    server.run()
    return 0 if server.started else 1


def main(argv: list[str] | None = None) -> int:
    """`python -m cli.serve ...`: this subcommand alone (no other CLI modules loaded)."""
    import sys

    from cli.main import add_log_level

    parser = argparse.ArgumentParser(prog="fp8serve")
    register(parser.add_subparsers(dest="command", required=True))
    try:
        add_log_level(parser)
    except CliError as exc:
        print(f"fp8serve: error: {exc}", file=sys.stderr)
        return exc.exit_code
    args = parser.parse_args(["serve", *(sys.argv[1:] if argv is None else argv)])
    logging.basicConfig(level=args.log_level,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return run(args)
    except CliError as exc:
        print(f"fp8serve: error: {exc}", file=sys.stderr)
        return exc.exit_code


if __name__ == "__main__":
    raise SystemExit(main())
