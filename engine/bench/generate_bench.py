"""Single-stream generation benchmark: prefill and decode tokens/s of fp8serve through the
model runner (the path the server takes), against baselines measured in the same process:

* the decode bandwidth bound: ``read bandwidth / bytes read per decode token``
  (see :func:`decode_bytes_per_token` for exactly what is counted);
* the prefill compute reference: torch bf16 matmul of the model's own linear shapes at
  M = prompt_len (same FLOPs as fp8serve's linears);
* Hugging Face transformers and llama.cpp (engine/bench/baselines.py).

Every figure is a ratio against something timed in this run: the machine is shared."""

from __future__ import annotations

import gc
import os
import platform
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import torch

from engine.bench.timing import measure_read_bandwidth, time_calls
from engine.config import ModelConfig
from engine.kernels.base import Fp8Weight
from engine.weights import LINEAR_NAMES, ModelWeights

BASELINES = ("transformers", "llamacpp")
BYTES_FORMULA = ("bytes/token = sum over decoder linears of weight bytes (FP8: N*K + scales; "
                 "bf16: 2*N*K) + lm_head bytes (V*H*2 bf16, or V*H FP8) + one embedding "
                 "row (H*2) + RMSNorm weights ((2*L+1)*H*2); KV-cache reads are not counted")
Log = Callable[[str], object]


@dataclass(frozen=True)
class GenerateBenchConfig:
    model_dir: Path
    prompt_len: int = 512
    gen_len: int = 64
    threads: int | None = None  # torch intra-op threads (and llama.cpp's); None = default
    baselines: tuple[str, ...] = BASELINES
    hf_dtype: str = "float32"  # transformers dequantizes FP8 into this dtype
    gguf: Path | None = None  # llama.cpp model; None = skip llama.cpp
    bandwidth_bytes: int = 1 << 30
    gemm_reps: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        if self.prompt_len < 1 or self.gen_len < 2:
            raise ValueError("need --prompt-len >= 1 and --gen-len >= 2")
        unknown = sorted(set(self.baselines) - set(BASELINES))
        if unknown:
            raise ValueError(f"unknown baseline(s) {unknown}; choose from {list(BASELINES)}")
        if self.hf_dtype not in ("float32", "bfloat16"):
            raise ValueError("hf_dtype must be float32 or bfloat16")


@dataclass(frozen=True)
class GenTiming:
    """One greedy generation: prefill = prompt forward + first token; decode = the rest."""

    prompt_tokens: int
    prefill_s: float
    decode_steps: int
    decode_s: float
    output_ids: tuple[int, ...] = field(default=(), repr=False)

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.prefill_s

    @property
    def decode_tps(self) -> float:
        return self.decode_steps / self.decode_s

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"prefill_tok_s": self.prefill_tps,
                               "decode_tok_s": self.decode_tps,
                               "output_ids": list(self.output_ids)}


def bench_prompt(vocab_size: int, n: int, seed: int = 0, bos: int | None = 1) -> list[int]:
    """``n`` token ids: ``bos`` then ids drawn uniformly from [100, min(vocab, 32000)) (no
    special tokens, so every backend sees the same ids and nothing stops early)."""
    rng = random.Random(seed)
    hi = max(101, min(vocab_size, 32000))
    body = [rng.randrange(100, hi) for _ in range(n)]
    return ([bos] + body[1:]) if bos is not None and n > 0 else body


def _linear_bytes(w: Fp8Weight | torch.Tensor) -> int:
    if isinstance(w, Fp8Weight):
        return w.weight.numel() + w.scale.numel() * w.scale.element_size()
    return w.numel() * w.element_size()


def decode_bytes_per_token(weights: ModelWeights) -> dict[str, Any]:
    """What one decode step must read from memory at least (see BYTES_FORMULA)."""
    cfg = weights.config
    fp8 = bf16 = 0
    for layer in weights.layers:
        for name in LINEAR_NAMES:
            w = getattr(layer, name)
            if isinstance(w, Fp8Weight):
                fp8 += _linear_bytes(w)
            else:
                bf16 += _linear_bytes(w)
    head = weights.embed_tokens if weights.lm_head is None else weights.lm_head
    parts = {"fp8_linear_bytes": fp8, "bf16_linear_bytes": bf16,
             "lm_head_bytes": _linear_bytes(head),
             "embedding_row_bytes": cfg.hidden_size * weights.embed_tokens.element_size(),
             "norm_bytes": (2 * cfg.num_layers + 1) * cfg.hidden_size * 2}
    return parts | {"total": sum(parts.values()), "formula": BYTES_FORMULA}


def prefill_linear_shapes(cfg: ModelConfig) -> list[tuple[str, int, int]]:
    """(name, N, K) of one decoder layer's linears as the engine runs them (q/k/v and
    gate/up fused): the same FLOPs as the seven unfused projections."""
    h = cfg.hidden_size
    return [("qkv_proj", cfg.q_size + 2 * cfg.kv_size, h), ("o_proj", h, cfg.q_size),
            ("gate_up_proj", 2 * cfg.intermediate_size, h), ("down_proj", h, cfg.intermediate_size)]


def bf16_prefill_reference(cfg: ModelConfig, m: int, reps: int) -> dict[str, Any]:
    """Torch bf16 matmul, x [m, K] @ w.T (w [N, K]), for every decoder linear at M = m, plus
    the lm_head at M = 1 (prefill computes one logit row): the time torch needs for the
    linear FLOPs of a prefill of ``m`` tokens, as an equivalent tokens/s."""
    gen = torch.Generator().manual_seed(0)
    per_shape: list[dict[str, Any]] = []
    layer_s, flops = 0.0, 0
    for name, n, k in prefill_linear_shapes(cfg):
        w = (torch.randn(n, k, generator=gen) * 0.02).to(torch.bfloat16)
        x = torch.randn(m, k, generator=gen).to(torch.bfloat16)
        s = time_calls([partial(torch.matmul, x, w.t())], reps=reps, warmup=1)
        per_shape.append({"name": name, "n": n, "k": k, "m": m, "s": s,
                          "tflops": 2 * m * n * k / s / 1e12})
        layer_s += s
        flops += 2 * m * n * k
        del w, x
    head_w = (torch.randn(cfg.vocab_size, cfg.hidden_size, generator=gen) * 0.02).bfloat16()
    hx = torch.randn(1, cfg.hidden_size, generator=gen).bfloat16()
    head_s = time_calls([partial(torch.matmul, hx, head_w.t())], reps=reps, warmup=1)
    total_s = cfg.num_layers * layer_s + head_s
    total_flops = cfg.num_layers * flops + 2 * cfg.vocab_size * cfg.hidden_size
    return {"m": m, "shapes": per_shape, "lm_head_s": head_s, "total_s": total_s,
            "total_flops": total_flops, "tflops": total_flops / total_s,
            "prefill_tok_s": m / total_s}


def time_runner(runner: Any, prompt: list[int], gen_len: int) -> GenTiming:
    """Greedy: one prefill chunk (logits of the last token, argmax), then ``gen_len - 1``
    single-token steps through the KV cache; argmax included in the timings."""
    from engine.batch import BatchInputs, SeqChunk

    blocks = tuple(range(-(-(len(prompt) + gen_len) // runner.block_size)))
    chunk = SeqChunk(0, tuple(prompt), 0, blocks)
    t0 = time.perf_counter()
    out = [int(torch.argmax(runner.run(BatchInputs((chunk,)))[0]))]
    t1 = time.perf_counter()
    for _ in range(gen_len - 1):
        chunk = SeqChunk(0, (out[-1],), chunk.start_pos + chunk.num_tokens, blocks)
        out.append(int(torch.argmax(runner.run(BatchInputs((chunk,)))[0])))
    t2 = time.perf_counter()
    return GenTiming(len(prompt), t1 - t0, gen_len - 1, t2 - t1, tuple(out))


def load_bench_runner(cfg: GenerateBenchConfig) -> tuple[Any, dict[str, Any], Any]:
    """(runner sized for one sequence of prompt_len + gen_len tokens, bytes per token,
    the HardwareInfo it was built for)."""
    from engine.config import EngineConfig
    from engine.hardware import probe_hardware
    from engine.kernels.registry import KernelOverrides
    from engine.loader import load_weights
    from engine.runner import ModelRunner

    weights = load_weights(cfg.model_dir, progress=False)
    need = cfg.prompt_len + cfg.gen_len + 16
    per_token = weights.config.kv_bytes_per_token()
    ecfg = EngineConfig(model_dir=cfg.model_dir, max_num_seqs=1, max_model_len=need,
                        threads=cfg.threads, max_num_batched_tokens=max(512, need),
                        kv_cache_gib=max(per_token * (need + 64) * 1.25 / 2**30, 1e-3))
    bytes_tok = decode_bytes_per_token(weights)
    hw = probe_hardware()
    runner = ModelRunner(weights, ecfg, hw, KernelOverrides.from_env())
    return runner, bytes_tok, hw


def run_fp8serve(cfg: GenerateBenchConfig, prompt: list[int], log: Log) -> dict[str, Any]:
    """Load, warm up (16-token prompt, 4 tokens), then one timed greedy generation."""
    t0 = time.perf_counter()
    runner, bytes_tok, hw = load_bench_runner(cfg)
    load_s = time.perf_counter() - t0
    log(f"fp8serve: loaded in {load_s:.1f} s; warm-up")
    time_runner(runner, prompt[: min(16, len(prompt))], 4)
    log("fp8serve: timed run")
    timing = time_runner(runner, prompt, cfg.gen_len)
    kernels = {f"{k}/{p}/{s}": n for (k, p, s), n in
               runner.kernel_report.selected_counts().items()}
    del runner
    gc.collect()
    ext = hw.extension
    return {"timing": timing, "bytes_per_token": bytes_tok, "load_s": load_s,
            "kernels": kernels, "extension": {"built": ext.built, "error": ext.error}}


def _host(threads: int) -> dict[str, Any]:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {"machine": platform.machine(), "cpu_model": model, "cpus": os.cpu_count(),
            "torch_threads": threads, "torch": torch.__version__,
            "loadavg_1m": os.getloadavg()[0]}


def _ratio(num: float | None, den: float | None) -> float | None:
    return None if not num or not den else num / den


def _agreement(ours: tuple[int, ...], theirs: list[int] | None) -> int | None:
    """Leading generated tokens on which two greedy runs agree (same weights: a sanity
    check that both ran the same model, not an accuracy measure)."""
    if theirs is None:
        return None
    n = 0
    for a, b in zip(ours, theirs, strict=False):
        if a != b:
            break
        n += 1
    return n


def _run_baselines(cfg: GenerateBenchConfig, prompt: list[int], threads: int,
                   log: Log) -> dict[str, Any]:
    from engine.bench.baselines import run_llamacpp, run_transformers

    out: dict[str, Any] = {}
    for name in cfg.baselines:
        log(f"{name}: loading and timing")
        if name == "transformers":
            out[name] = run_transformers(cfg.model_dir, prompt, cfg.gen_len, cfg.hf_dtype)
        else:
            out[name] = run_llamacpp(cfg.gguf, prompt, cfg.gen_len, threads)
        if "skipped" in out[name]:
            log(f"{name}: skipped: {out[name]['skipped']}")
    return out


def run_generate_bench(cfg: GenerateBenchConfig, log: Log = print) -> dict[str, Any]:
    """Everything in one process, in order: read bandwidth, bf16 GEMM reference, fp8serve,
    read bandwidth again, then each baseline (fp8serve's memory is released first)."""
    from engine.loader import read_model_config

    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    threads = torch.get_num_threads()
    mcfg = read_model_config(cfg.model_dir)
    prompt = bench_prompt(mcfg.vocab_size, cfg.prompt_len, cfg.seed, mcfg.bos_token_id)
    log(f"read bandwidth ({cfg.bandwidth_bytes >> 20} MiB)")
    bw = [measure_read_bandwidth(cfg.bandwidth_bytes)]
    log(f"torch bf16 GEMMs at M={cfg.prompt_len}")
    gemm = bf16_prefill_reference(mcfg, cfg.prompt_len, cfg.gemm_reps)
    ours = run_fp8serve(cfg, prompt, log)
    bw.append(measure_read_bandwidth(cfg.bandwidth_bytes))
    timing: GenTiming = ours.pop("timing")
    bytes_tok = ours.pop("bytes_per_token")
    bound_tps = max(bw) * 1e9 / bytes_tok["total"]
    base = _run_baselines(cfg, prompt, threads, log)
    ratios = {"decode_vs_bandwidth_bound": timing.decode_tps / bound_tps,
              "prefill_vs_bf16_matmul": timing.prefill_tps / gemm["prefill_tok_s"]}
    for name, res in base.items():
        ratios[f"decode_vs_{name}"] = _ratio(timing.decode_tps, res.get("decode_tok_s"))
        ratios[f"prefill_vs_{name}"] = _ratio(timing.prefill_tps, res.get("prefill_tok_s"))
    return {
        "schema": 1, "host": _host(threads),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
        "model": {"dir": str(cfg.model_dir), "name": cfg.model_dir.name,
                  "num_layers": mcfg.num_layers, "hidden_size": mcfg.hidden_size,
                  "intermediate_size": mcfg.intermediate_size,
                  "vocab_size": mcfg.vocab_size, "tied": mcfg.tie_word_embeddings},
        "read_bandwidth_gbps": max(bw), "read_bandwidth_samples_gbps": bw,
        "bytes_per_token": bytes_tok,
        "fp8serve": timing.to_dict() | ours,
        "bandwidth_bound": {"decode_tok_s": bound_tps,
                            "formula": "read_bandwidth / bytes_per_token.total"},
        "bf16_matmul": gemm, "baselines": base, "ratios": ratios,
        "agreement_tokens": {n: _agreement(timing.output_ids, r.get("output_ids"))
                             for n, r in base.items()},
    }
