"""`fp8serve generate`: run one prompt through a checkpoint (default: the demo model) and
stream the text to stdout as it is produced; tokens/s (prefill, decode) go to stderr."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cli.kernels import add_kernel_args, overrides_from_args
from engine.config_flags import add_kv_cache_dtype_arg, add_lm_head_arg, threads_problem


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text from a prompt, streamed to the terminal")
    p.add_argument("--model", type=Path, default=None,
                   help="checkpoint directory (default: the demo model, converted once)")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--prompt", help="raw prompt text (no chat template)")
    src.add_argument("--chat", help="one user message, rendered with the chat template")
    p.add_argument("--system", default=None, help="system message for --chat")
    p.add_argument("--max-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k", type=int, default=-1)
    p.add_argument("--min-p", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--repetition-penalty", type=float, default=1.0)
    p.add_argument("--presence-penalty", type=float, default=0.0)
    p.add_argument("--frequency-penalty", type=float, default=0.0)
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    p.add_argument("--ignore-eos", action="store_true")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--max-model-len", type=int, default=None,
                   help="prompt + output tokens (default 4096, or the checkpoint's "
                   "max_position_embeddings where smaller, as serve's default)")
    add_kernel_args(p)
    add_lm_head_arg(p)
    add_kv_cache_dtype_arg(p)
    p.set_defaults(func=run)


@dataclass(frozen=True)
class GenStats:
    prompt_tokens: int
    output_tokens: int
    prefill_s: float  # until the first token was sampled
    decode_s: float  # from the first to the last token
    finish_reason: str  # "stop" | "length"


def sampling_params(args: argparse.Namespace) -> Any:
    """The flags' SamplingParams; a value out of range raises ValueError naming the flag
    and the value given (``--top-p 5.0: must be in (0, 1], ...``)."""
    from engine.sampling_params import SamplingParams, SamplingParamsError

    try:
        return SamplingParams(
            max_tokens=args.max_tokens, temperature=args.temperature, top_p=args.top_p,
            top_k=args.top_k, min_p=args.min_p, seed=args.seed, stop=tuple(args.stop),
            ignore_eos=args.ignore_eos, repetition_penalty=args.repetition_penalty,
            presence_penalty=args.presence_penalty, frequency_penalty=args.frequency_penalty)
    except SamplingParamsError as exc:  # "field: problem", the request field's name
        field, _, problem = str(exc).partition(": ")
        if not problem or not hasattr(args, field):
            raise
        raise ValueError(f"--{field.replace('_', '-')} {getattr(args, field)}: "
                         f"{problem}") from None


def _is_stop_token(token: int, n: int, params: Any, eos: frozenset[int]) -> bool:
    if n < params.min_tokens:
        return False
    return (token in eos and not params.ignore_eos) or token in params.stop_token_ids


def stream_generate(runner: Any, tokenizer: Any, prompt_ids: list[int], params: Any,
                    write: Callable[[str], Any]) -> GenStats:
    """One sequence: prefill once, then one token per step through the KV cache; text goes
    to ``write`` as soon as the detokenizer releases it."""
    from engine.batch import BatchInputs, SeqChunk
    from engine.sampler import Sampler, make_generator
    from engine.text.detokenizer import IncrementalDetokenizer

    blocks = tuple(range(-(-(len(prompt_ids) + params.max_tokens) // runner.block_size)))
    detok = IncrementalDetokenizer(tokenizer, prompt_ids, params.stop,
                                   params.skip_special_tokens, params.include_stop_str_in_output)
    sampler, gen = Sampler(tokenizer.eos_token_ids), make_generator(params.seed)
    out: list[int] = []
    n = len(prompt_ids)
    chunk = SeqChunk(0, tuple(prompt_ids), 0, blocks, prompt_len=n)
    t0, t_first, reason = time.perf_counter(), None, "length"
    while len(out) < params.max_tokens:
        logits = runner.run(BatchInputs((chunk,)))
        token = int(sampler(logits, [params], [prompt_ids], [out], [gen]).token_ids[0])
        out.append(token)
        t_first = t_first or time.perf_counter()
        step = detok.push(token)
        write(step.new_text)
        if step.stopped or _is_stop_token(token, len(out), params, tokenizer.eos_token_ids):
            reason = "stop"
            break
        chunk = SeqChunk(0, (token,), chunk.start_pos + chunk.num_tokens, blocks, prompt_len=n)
    write(detok.flush())
    t_end = time.perf_counter()
    t_first = t_first or t_end
    return GenStats(len(prompt_ids), len(out), t_first - t0, t_end - t_first, reason)


def _prompt_ids(tokenizer: Any, args: argparse.Namespace) -> list[int]:
    if args.prompt is not None:
        ids = tokenizer.encode(args.prompt)
        if not ids:  # nothing for the model to continue (this tokenizer adds no BOS)
            raise ValueError("--prompt: the prompt is empty (0 tokens)")
        return ids
    messages = [{"role": "system", "content": args.system}] if args.system else []
    return tokenizer.encode_chat(messages + [{"role": "user", "content": args.chat}])


def check_args(args: argparse.Namespace) -> None:
    """Flags that contradict each other or cannot work, before anything is loaded."""
    if args.system is not None and args.prompt is not None:
        raise ValueError("--system applies to --chat only; with --prompt, put it in the "
                         "prompt text")
    if args.max_model_len is not None and args.max_model_len < 2:
        raise ValueError(f"--max-model-len {args.max_model_len}: must be >= 2")
    if args.threads is not None:
        # the check `serve` applies to its --threads (service/settings.py), same message
        problem = "must be >= 1" if args.threads < 1 else threads_problem(args.threads)
        if problem is not None:
            raise ValueError(f"--threads {args.threads}: {problem}")


def _load(args: argparse.Namespace, params: Any) -> tuple[Any, Any, list[int]]:
    from engine.config import EngineConfig
    from engine.loader import read_model_config
    from engine.runner import load_runner
    from engine.text.tokenizer import Tokenizer

    model_dir = args.model
    if model_dir is not None and not Path(model_dir).is_dir():
        why = "is not a directory" if Path(model_dir).exists() else "does not exist"
        raise FileNotFoundError(f"model directory {model_dir} {why}")
    if model_dir is None:
        from engine.demo_model import ensure_demo_model

        model_dir = ensure_demo_model()
    model_config = read_model_config(Path(model_dir))  # an empty directory: its config first
    tokenizer = Tokenizer.from_dir(model_dir)
    tokenizer.check_fits(model_config.vocab_size)
    prompt_ids = _prompt_ids(tokenizer, args)
    need = len(prompt_ids) + params.max_tokens
    # as serve's default: the checkpoint's positions where fewer (it warned on every run)
    max_len = args.max_model_len or min(4096, model_config.max_position_embeddings)
    if need > max_len:
        raise ValueError(f"prompt ({len(prompt_ids)} tokens) + max_tokens exceeds "
                         f"--max-model-len {max_len}")
    per_token = model_config.kv_bytes_per_token()
    cfg = EngineConfig(model_dir=Path(model_dir), max_model_len=max_len,
                       threads=args.threads, kernel=args.kernel, max_num_seqs=1,
                       lm_head_dtype=args.lm_head_dtype or "auto",
                       kv_cache_dtype=args.kv_cache_dtype or "auto",
                       kv_cache_gib=max(per_token * (need + 64) * 1.25 / 2**30, 1e-3))
    overrides = overrides_from_args(args)
    return load_runner(model_dir, cfg, overrides=overrides), tokenizer, prompt_ids


def _write_stdout(text: str) -> None:
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()


def run(args: argparse.Namespace) -> int:
    from cli.main import CliError

    try:
        check_args(args)
        params = sampling_params(args)
        runner, tokenizer, prompt_ids = _load(args, params)
    except Exception as exc:  # one line for the user: bad checkpoint, flags or template
        raise CliError(str(exc) or type(exc).__name__) from None
    try:
        stats = stream_generate(runner, tokenizer, prompt_ids, params, _write_stdout)
    except KeyboardInterrupt:
        # Ctrl-C: end the partial text's line, so the shell prompt starts on its own
        sys.stdout.write("\n")
        sys.stdout.flush()
        print("[interrupted]", file=sys.stderr)
        return 130
    sys.stdout.write("\n")
    pre = stats.prompt_tokens / stats.prefill_s if stats.prefill_s > 0 else float("inf")
    dec = (stats.output_tokens - 1) / stats.decode_s if stats.decode_s > 0 else 0.0
    print(f"[{stats.prompt_tokens} prompt tokens, {stats.output_tokens} generated, "
          f"finish: {stats.finish_reason}] prefill {pre:.1f} tok/s, decode {dec:.1f} tok/s",
          file=sys.stderr)
    return 0
