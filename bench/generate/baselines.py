"""Other engines timed on the same greedy generation as fp8serve (same prompt ids, same
number of generated tokens, same thread count), each in this process:

* Hugging Face transformers on the same checkpoint directory (it dequantizes FP8 on CPU
  into ``dtype``, float32 or bfloat16), its own ``generate`` with greedy decoding;
* llama.cpp through ``llama-cpp-python`` (the ``bench`` extra; benchmarks only) on a GGUF:
  the demo model's original Q4_1 file, ``--gguf``, or the checkpoint's own weights
  exported to Q8_0 and BF16 (bench/generate/gguf_export.py), each loaded once as a
  :class:`LlamaCppEngine` and timed in the interleaved rounds (bench/generate/rounds.py).
  The bindings load this host's llama.cpp build (bench/llamacpp/) when there is one
  (``llamacpp_lib``: auto, native, installed; :func:`choose_llamacpp_library`); the
  library and the SIMD levels it reports are in the result.

Results are dicts with ``prefill_s``, ``decode_s``, ``decode_steps``, ``prefill_tok_s``,
``decode_tok_s``, ``output_ids`` (or ``{"skipped": reason}`` when the package or file is
missing). Prefill = prompt forward + first token; decode = the rest."""

from __future__ import annotations

import gc
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from bench.generate.gen_timing import GenTiming

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


class LlamaCppEngine:
    """llama.cpp (llama-cpp-python) on one GGUF, loaded once for several timed runs."""

    def __init__(self, gguf: Path, n_ctx: int, threads: int) -> None:
        import llama_cpp

        t0 = time.perf_counter()
        self.llm = llama_cpp.Llama(model_path=str(gguf), n_ctx=n_ctx,
                                   n_batch=max(512, n_ctx), n_ubatch=max(512, n_ctx),
                                   n_threads=threads, n_threads_batch=threads,
                                   logits_all=False, verbose=False)
        self.load_s = time.perf_counter() - t0
        self.info = {"engine": f"llama-cpp-python {llama_cpp.__version__}",
                     "gguf": str(gguf), "threads": threads, "load_s": self.load_s,
                     "bytes_per_token": gguf_bytes_per_token(Path(gguf)),
                     "library": str(llama_cpp.llama_cpp._lib._name),
                     "system_info": llama_cpp.llama_print_system_info().decode()
                     .strip().rstrip(" |")}

    def generate(self, prompt: list[int], n: int) -> GenTiming:
        """Greedy; prefill = prompt eval + first token; no prefix reuse between calls."""
        llm = self.llm
        llm.reset()
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

    def close(self) -> None:
        if hasattr(self.llm, "close"):
            self.llm.close()
        del self.llm
        gc.collect()


def gguf_bytes_per_token(path: Path) -> int:
    """Weight bytes llama.cpp reads per decode token: every tensor, less the token
    embedding when a separate output matrix exists (then one row is read); a tied
    token_embd is read whole as the output."""
    from gguf import GGUFReader

    ts = {t.name: int(t.n_bytes) for t in GGUFReader(path).tensors}
    total = sum(ts.values())
    if "output.weight" in ts and "token_embd.weight" in ts:
        total -= ts["token_embd.weight"]
    return total


def llamacpp_available() -> str | None:
    """None when llama-cpp-python imports, else the reason it does not."""
    try:
        import llama_cpp  # noqa: F401
    except ImportError as exc:
        return f"llama-cpp-python is not installed (pip install '.[bench]'): {exc}"
    return None


def choose_llamacpp_library(choice: str, log: Callable[[str], object]) -> str:
    """Points llama-cpp-python at a library before its first import; returns which, in
    words. ``native``: this host's build (bench/llamacpp/build.py), built first if
    missing; ``auto``: that build when it exists, else the package's own; ``installed``:
    the package's own (the Makefile's portable AVX2 build)."""
    import os
    import sys

    if "llama_cpp" in sys.modules:
        return "the library already loaded in this process"
    if choice == "installed":
        os.environ.pop("LLAMA_CPP_LIB_PATH", None)
        return "llama-cpp-python's own library"
    from bench.llamacpp.build import ensure_native, planned
    from engine.hardware_probe import probe_hardware

    hw = probe_hardware()
    build = ensure_native(hw, log) if choice == "native" else planned(hw)[0]
    if not build.is_complete():
        return "llama-cpp-python's own library (no build for this host: fp8serve bench llamacpp)"
    os.environ["LLAMA_CPP_LIB_PATH"] = str(build.lib_dir)
    return f"this host's build ({build.how}), {build.lib_dir}"


def llamacpp_ggufs(cfg: Any, log: Callable[[str], object]) -> dict[str, Path | None]:
    """{baseline name: GGUF}: ``cfg.gguf`` as 'llamacpp', else one export per gguf_type
    ('llamacpp_q8_0', 'llamacpp_bf16'), cached beside the checkpoint."""
    if cfg.gguf is not None:
        return {"llamacpp": cfg.gguf}
    from bench.generate.gguf_export import ensure_gguf

    return {f"llamacpp_{q.lower()}": ensure_gguf(cfg.model_dir, q, log) for q in cfg.gguf_types}


def llamacpp_engines(cfg: Any, prompt: list[int], threads: int,
                     log: Callable[[str], object]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(loaded and warmed-up LlamaCppEngine per baseline name, {name: {"skipped": why}})."""
    if "llamacpp" not in cfg.baselines:
        return {}, {}
    names = ["llamacpp"] if cfg.gguf is not None else \
        [f"llamacpp_{q.lower()}" for q in cfg.gguf_types]
    library = choose_llamacpp_library(cfg.llamacpp_lib, log)  # before the first import
    missing = llamacpp_available()
    if missing is None and cfg.gguf is None:
        try:
            import gguf  # noqa: F401
        except ImportError:
            missing = "the gguf package is not installed (pip install '.[bench]')"
    if missing:
        return {}, {n: {"skipped": missing} for n in names}
    log(f"llama.cpp library: {library}")
    engines: dict[str, Any] = {}
    skipped: dict[str, Any] = {}
    for name, path in llamacpp_ggufs(cfg, log).items():
        if path is None or not Path(path).is_file():
            skipped[name] = {"skipped": f"no GGUF for this model ({path or 'pass --gguf'})"}
            continue
        log(f"{name}: loading {path}")
        eng = LlamaCppEngine(Path(path), len(prompt) + cfg.gen_len + 16, threads)
        eng.generate(prompt[:WARMUP_PROMPT], WARMUP_TOKENS)
        engines[name] = eng
    return engines, skipped
