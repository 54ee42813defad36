"""Other engines timed on the same greedy generation as fp8serve (same prompt ids, same
number of generated tokens, same thread count), each in this process:

* Hugging Face transformers on the same checkpoint directory (it dequantizes FP8 on CPU
  into ``dtype``, float32 or bfloat16), its own ``generate`` with greedy decoding;
* llama.cpp through ``llama-cpp-python`` on a GGUF (the demo model's original Q4_1 file).

Each ``run_*`` returns a dict with ``prefill_s``, ``decode_s``, ``decode_steps``,
``prefill_tok_s``, ``decode_tok_s``, ``output_ids`` (or ``{"skipped": reason}`` when the
package or file is missing). Prefill = prompt forward + first token; decode = the rest."""

from __future__ import annotations

import gc
import json
import time
from pathlib import Path
from typing import Any

import torch

from engine.bench.generate_bench import GenTiming

WARMUP_PROMPT, WARMUP_TOKENS = 16, 4


def _architecture(model_dir: Path) -> str:
    try:
        archs = json.loads((model_dir / "config.json").read_text()).get("architectures")
    except (OSError, ValueError):
        return ""
    return archs[0] if archs else ""


def _hf_model(model_dir: Path, dtype: torch.dtype) -> Any:
    import transformers

    if _architecture(model_dir) == "Mistral3ForConditionalGeneration":
        cls: Any = transformers.Mistral3ForConditionalGeneration
    else:
        cls = transformers.AutoModelForCausalLM
    return cls.from_pretrained(model_dir, dtype=dtype).eval()


class _TokenClock:
    """A transformers streamer that stamps the time of every ``put`` (the first is the
    prompt, then one per generated token)."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def put(self, value: Any) -> None:
        self.times.append(time.perf_counter())

    def end(self) -> None:
        pass


def _hf_generate(model: Any, prompt: list[int], n: int) -> GenTiming:
    clock = _TokenClock()
    ids = torch.tensor([prompt], dtype=torch.int64)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                             num_beams=1, max_new_tokens=n, min_new_tokens=n,
                             pad_token_id=0, streamer=clock)
    new = out[0, len(prompt):].tolist()
    if len(clock.times) != n + 1 or len(new) != n:
        raise RuntimeError(f"transformers generated {len(new)} tokens, expected {n}")
    first, last = clock.times[1], clock.times[-1]
    return GenTiming(len(prompt), first - t0, n - 1, last - first, tuple(new))


def run_transformers(model_dir: Path, prompt: list[int], gen_len: int,
                     dtype: str = "float32") -> dict[str, Any]:
    """transformers' own ``generate`` (greedy, KV cache) on the dequantized checkpoint."""
    try:
        import transformers
    except ImportError:
        return {"skipped": "transformers is not installed"}
    t0 = time.perf_counter()
    try:
        model = _hf_model(Path(model_dir), getattr(torch, dtype))
    except Exception as exc:  # an architecture this transformers cannot load
        return {"skipped": f"transformers cannot load {model_dir}: {exc}"}
    load_s = time.perf_counter() - t0
    param_dtype = str(next(model.parameters()).dtype).replace("torch.", "")
    _hf_generate(model, prompt[:WARMUP_PROMPT], WARMUP_TOKENS)
    timing = _hf_generate(model, prompt, gen_len)
    del model
    gc.collect()
    return timing.to_dict() | {"engine": f"transformers {transformers.__version__}",
                               "dtype": param_dtype, "load_s": load_s}


def _llama_generate(llm: Any, prompt: list[int], n: int) -> GenTiming:
    llm.reset()  # forget earlier tokens: no prefix reuse between runs
    t0 = time.perf_counter()
    it = llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0,
                      repeat_penalty=1.0, reset=True)
    out = [int(next(it))]
    t1 = time.perf_counter()
    for _ in range(n - 1):
        out.append(int(next(it)))
    t2 = time.perf_counter()
    it.close()
    return GenTiming(len(prompt), t1 - t0, n - 1, t2 - t1, tuple(out))


def run_llamacpp(gguf: Path | None, prompt: list[int], gen_len: int,
                 threads: int) -> dict[str, Any]:
    """llama.cpp on ``gguf`` with ``threads`` threads for prefill and decode."""
    try:
        import llama_cpp
    except ImportError:
        return {"skipped": "llama-cpp-python is not installed (pip install llama-cpp-python)"}
    if gguf is None or not Path(gguf).is_file():
        return {"skipped": f"no GGUF for this model ({gguf or 'pass --gguf'})"}
    n_ctx = len(prompt) + gen_len + 16
    t0 = time.perf_counter()
    llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=n_ctx, n_batch=max(512, n_ctx),
                          n_ubatch=max(512, n_ctx), n_threads=threads,
                          n_threads_batch=threads, logits_all=False, verbose=False)
    load_s = time.perf_counter() - t0
    _llama_generate(llm, prompt[:WARMUP_PROMPT], WARMUP_TOKENS)
    timing = _llama_generate(llm, prompt, gen_len)
    llm.close() if hasattr(llm, "close") else None
    del llm
    gc.collect()
    return timing.to_dict() | {"engine": f"llama-cpp-python {llama_cpp.__version__}",
                               "gguf": str(gguf), "threads": threads, "load_s": load_s}
