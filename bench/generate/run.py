"""Single-stream generation benchmark: prefill and decode tokens/s of fp8serve through the
model runner (the path the server takes), against baselines measured in the same process:

* the decode bandwidth bound: ``read bandwidth / bytes read per decode token``
  (see :func:`decode_bytes_per_token` for exactly what is counted); the read bandwidth
  is the best read_xor sample (bench/common/read_probe.py) taken right before and right
  after the timed generation, the former torch-sum figure reported beside it;
* the prefill compute reference: torch bf16 matmul of the model's own linear shapes at
  M = prompt_len (same FLOPs as fp8serve's linears);
* Hugging Face transformers and llama.cpp (bench/generate/baselines.py);
* ``python_layers``: the same runner with every decoder layer on the Python path (torch
  ops, what FP8SERVE_FUSED=0 runs) instead of the fused C++ op, timed in the same
  interleaved rounds: what the fused op is worth on this host.

Every figure is a ratio against something timed in this run: the machine is shared."""

from __future__ import annotations

import gc
import os
import platform
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch

from bench.common.read_probe import ReadProbe, best_of
from bench.generate.gen_timing import GenTiming
from bench.generate.refs import (  # noqa: F401 - re-exported for callers
    BYTES_FORMULA,
    bf16_prefill_reference,
    decode_bytes_per_token,
    prefill_linear_shapes,
)
from bench.llamacpp.build import LIBRARY_CHOICES

BASELINES = ("transformers", "llamacpp", "python_layers")
PYTHON_LAYERS = "python_layers"
KERNELS_OFF = "kernels_off"  # GenerateBenchConfig.against_disabled
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
    bandwidth_bytes: int = 1 << 30  # read-probe buffer
    bandwidth_passes: int = 5  # best of this many passes per probe sample
    lm_head_dtype: str = "auto"  # engine/model/lm_head.py
    kv_cache_dtype: str = "auto"  # engine/model/kv_store.py
    rounds: int = 1  # interleaved timed rounds of fp8serve and llama.cpp (bench/generate/rounds.py)
    gguf_types: tuple[str, ...] = ("Q8_0", "BF16")  # exports timed when gguf is None
    llamacpp_lib: str = "auto"  # baselines.choose_llamacpp_library
    gemm_reps: int = 3
    seed: int = 0
    # a second runner of the same checkpoint with these kernel ids disabled as well (e.g.
    # amx_w8a16,amx_block_w8a16: the fused AVX-512 path on an AMX host), timed in the same
    # rounds as baseline KERNELS_OFF: an A/B of kernel choices in one process
    against_disabled: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.prompt_len < 1 or self.gen_len < 2:
            raise ValueError("need --prompt-len >= 1 and --gen-len >= 2")
        unknown = sorted(set(self.baselines) - set(BASELINES))
        if unknown:
            raise ValueError(f"unknown baseline(s) {unknown}; choose from {list(BASELINES)}")
        if self.hf_dtype not in ("float32", "bfloat16"):
            raise ValueError("hf_dtype must be float32 or bfloat16")
        if self.bandwidth_bytes < 64 or self.bandwidth_bytes % 64:
            raise ValueError("the bandwidth probe needs a positive multiple of 64 bytes")
        if self.rounds < 1:
            raise ValueError("need --rounds >= 1")
        if self.llamacpp_lib not in LIBRARY_CHOICES:
            raise ValueError(f"--llamacpp-lib: choose from {', '.join(LIBRARY_CHOICES)}")
        if self.against_disabled:
            from engine.kernels.registry import KernelOverrides

            KernelOverrides(disabled=frozenset(self.against_disabled))  # names unknown ids
        bad = sorted(set(self.gguf_types) - {"Q8_0", "BF16"})
        if bad or not self.gguf_types:
            raise ValueError(f"--gguf-types: choose from Q8_0, BF16 (got {bad or 'none'})")


def bench_prompt(vocab_size: int, n: int, seed: int = 0, bos: int | None = 1) -> list[int]:
    """``n`` token ids: ``bos`` then ids drawn uniformly from [100, min(vocab, 32000)) (no
    special tokens, so every backend sees the same ids and nothing stops early)."""
    rng = random.Random(seed)
    hi = max(101, min(vocab_size, 32000))
    body = [rng.randrange(100, hi) for _ in range(n)]
    return ([bos] + body[1:]) if bos is not None and n > 0 else body


def time_runner(runner: Any, prompt: list[int], gen_len: int) -> GenTiming:
    """Greedy: one prefill chunk (logits of the last token, argmax), then ``gen_len - 1``
    single-token steps through the KV cache; argmax included in the timings."""
    from engine.batch import BatchInputs, SeqChunk

    blocks = tuple(range(-(-(len(prompt) + gen_len) // runner.block_size)))
    chunk = SeqChunk(0, tuple(prompt), 0, blocks, prompt_len=len(prompt))
    t0 = time.perf_counter()
    out = [int(torch.argmax(runner.run(BatchInputs((chunk,)))[0]))]
    t1 = time.perf_counter()
    for _ in range(gen_len - 1):
        chunk = SeqChunk(0, (out[-1],), chunk.start_pos + chunk.num_tokens, blocks,
                         prompt_len=len(prompt))
        out.append(int(torch.argmax(runner.run(BatchInputs((chunk,)))[0])))
    t2 = time.perf_counter()
    return GenTiming(len(prompt), t1 - t0, gen_len - 1, t2 - t1, tuple(out))


def load_bench_runner(cfg: GenerateBenchConfig, disabled: tuple[str, ...] = ()
                      ) -> tuple[Any, dict[str, Any], Any]:
    """(runner sized for one sequence of prompt_len + gen_len tokens, bytes per token,
    the HardwareInfo it was built for); ``disabled``: kernel ids disabled on top of the
    environment's overrides."""
    from engine.config import EngineConfig
    from engine.hardware_probe import probe_hardware
    from engine.kernels.registry import KernelOverrides
    from engine.loader import load_weights
    from engine.runner import ModelRunner

    weights = load_weights(cfg.model_dir, progress=False)
    need = cfg.prompt_len + cfg.gen_len + 16
    per_token = weights.config.kv_bytes_per_token()
    ecfg = EngineConfig(model_dir=cfg.model_dir, max_num_seqs=1, max_model_len=need,
                        threads=cfg.threads, max_num_batched_tokens=max(512, need),
                        kv_cache_gib=max(per_token * (need + 64) * 1.25 / 2**30, 1e-3),
                        lm_head_dtype=cfg.lm_head_dtype, kv_cache_dtype=cfg.kv_cache_dtype)
    bytes_tok = decode_bytes_per_token(weights, cfg.lm_head_dtype)
    hw = probe_hardware()
    env = KernelOverrides.from_env()
    overrides = KernelOverrides(env.forced, env.disabled | frozenset(disabled), env.forced_bf16)
    runner = ModelRunner(weights, ecfg, hw, overrides)
    return runner, bytes_tok, hw


def time_python_layers(runner: Any, prompt: list[int], gen_len: int) -> GenTiming:
    """time_runner with every decoder layer on the Python path; the runner's fusion is
    restored afterwards (its next fused call checks each layer again, then stacks them)."""
    runner.model.set_fusion(False, "bench generate: the python_layers round")
    try:
        return time_runner(runner, prompt, gen_len)
    finally:
        runner.model.set_fusion(None)


def load_fp8serve(cfg: GenerateBenchConfig, prompt: list[int], log: Log,
                  disabled: tuple[str, ...] = ()) -> dict[str, Any]:
    """The runner (``disabled``: see load_bench_runner), loaded and warmed up (16-token
    prompt, 4 tokens), with its byte count per decode token and load time."""
    t0 = time.perf_counter()
    runner, bytes_tok, hw = load_bench_runner(cfg, disabled)
    load_s = time.perf_counter() - t0
    off = f" with {','.join(disabled)} disabled" if disabled else ""
    log(f"fp8serve{off}: loaded in {load_s:.1f} s; warm-up")
    time_runner(runner, prompt[: min(16, len(prompt))], 4)
    return {"runner": runner, "bytes_per_token": bytes_tok, "load_s": load_s, "hw": hw}


def release_fp8serve(loaded: dict[str, Any]) -> dict[str, Any]:
    """What the result reports about the runner (kernels, lm_head kernel, extension);
    the runner is dropped."""
    runner = loaded.pop("runner")
    kernels = {f"{k}/{p}/{s}": n for (k, p, s), n in
               runner.kernel_report.selected_counts().items()}
    # layers whose generated rows (decode) run another kernel (AMX hosts: rows by role)
    generated = {f"{k}->{g}": n for (k, g), n in
                 runner.kernel_report.generated_counts().items()}
    head = runner.model.lm_head
    head_kernel = getattr(head, "kernel_id", None) or head.kernel.kernel.id
    reasons = runner.model.fusion_reasons
    fused = f"{reasons.count(None)} of {len(reasons)}"
    del runner
    gc.collect()
    ext = loaded.pop("hw").extension
    return {"load_s": loaded["load_s"], "kernels": kernels, "generated_rows": generated,
            "lm_head_kernel": head_kernel,
            "fused_layers": fused, "extension": {"built": ext.built, "error": ext.error}}


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


def _bandwidth(samples: list[dict[str, Any]], bytes_tok: dict[str, Any]) -> dict[str, Any]:
    """The bound from the samples bracketing fp8serve's timed run: read_xor's best (the
    torch-sum best when the extension is missing), and the torch-sum figure beside it."""
    around = [s for s in samples if s["label"].endswith("fp8serve")]
    xor, tsum = best_of(around, "read_xor_gbps"), best_of(around, "torch_sum_gbps")
    assert tsum is not None, "no bandwidth sample around the timed run"
    gbps = xor if xor is not None else tsum
    return {"gbps": gbps, "probe": "read_xor" if xor is not None else "torch_sum",
            "torch_sum_gbps": tsum, "decode_tok_s": gbps * 1e9 / bytes_tok["total"],
            "torch_sum_decode_tok_s": tsum * 1e9 / bytes_tok["total"]}


def run_generate_bench(cfg: GenerateBenchConfig, log: Log = print) -> dict[str, Any]:
    """Everything in one process, in order: the bf16 GEMM reference; fp8serve and each
    llama.cpp GGUF loaded, then ``cfg.rounds`` interleaved timed rounds of them
    (bench/generate/rounds.py); then transformers alone (the others released first). A
    read-bandwidth sample right before and right after each timed generation. Figures
    are the median round's; ratios against llama.cpp the median of per-round ratios."""
    from bench.generate.baselines import llamacpp_engines
    from bench.generate.rounds import Contender, median_round, per_round, run_rounds
    from engine.loader import read_model_config

    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    threads = torch.get_num_threads()
    mcfg = read_model_config(cfg.model_dir)
    prompt = bench_prompt(mcfg.vocab_size, cfg.prompt_len, cfg.seed, mcfg.bos_token_id)
    log(f"read-bandwidth probe: {cfg.bandwidth_bytes >> 20} MiB, best of "
        f"{cfg.bandwidth_passes} passes")
    probe = ReadProbe(cfg.bandwidth_bytes, cfg.bandwidth_passes)
    samples = [probe.sample("before bf16 matmul")]
    log(f"torch bf16 GEMMs at M={cfg.prompt_len}")
    gemm = bf16_prefill_reference(mcfg, cfg.prompt_len, cfg.gemm_reps)
    samples.append(probe.sample("after bf16 matmul"))
    loaded = load_fp8serve(cfg, prompt, log)
    off = load_fp8serve(cfg, prompt, log, cfg.against_disabled) if cfg.against_disabled else None
    engines, base = llamacpp_engines(cfg, prompt, threads, log)
    contenders = [Contender("fp8serve", partial(time_runner, loaded["runner"]))]
    if off is not None:
        contenders.append(Contender(KERNELS_OFF, partial(time_runner, off["runner"])))
    if PYTHON_LAYERS in cfg.baselines:
        time_python_layers(loaded["runner"], prompt[: min(16, len(prompt))], 4)  # warm-up
        contenders.append(Contender(PYTHON_LAYERS, partial(time_python_layers,
                                                           loaded["runner"])))
    contenders += [Contender(n, e.generate) for n, e in engines.items()]
    timings = run_rounds(contenders, prompt, cfg.gen_len, cfg.rounds, probe, samples, log)
    del contenders  # the runner's last reference is loaded["runner"]
    bytes_tok = loaded["bytes_per_token"]
    ours = release_fp8serve(loaded) | {"rounds": per_round(timings["fp8serve"])}
    if off is not None:  # same checkpoint, other kernels: bytes per token from its own
        off_bytes = off["bytes_per_token"]["total"]
        base[KERNELS_OFF] = (median_round(timings[KERNELS_OFF]).to_dict() | release_fp8serve(off)
                             | {"disabled": list(cfg.against_disabled),
                                "bytes_per_token": off_bytes,
                                "rounds": per_round(timings[KERNELS_OFF])})
    for name, eng in engines.items():
        eng.close()
        base[name] = (median_round(timings[name]).to_dict() | eng.info
                      | {"rounds": per_round(timings[name])})
    if PYTHON_LAYERS in timings:  # same weights and kernels, so the same bytes per token
        base[PYTHON_LAYERS] = (median_round(timings[PYTHON_LAYERS]).to_dict()
                               | {"bytes_per_token": bytes_tok["total"],
                                  "rounds": per_round(timings[PYTHON_LAYERS])})
    if "transformers" in cfg.baselines:
        base |= _run_transformers(cfg, prompt, log, probe, samples)
    timing = median_round(timings["fp8serve"])
    bw = _bandwidth(samples, bytes_tok)
    ratios = _ratios(timing, timings, base, bw, gemm)
    return _result(cfg, mcfg, threads, timing, ours, bytes_tok, bw, samples, gemm, base,
                   ratios)


def _run_transformers(cfg: GenerateBenchConfig, prompt: list[int], log: Log,
                      probe: ReadProbe, samples: list[dict[str, Any]]) -> dict[str, Any]:
    from bench.generate.baselines import run_transformers

    log("transformers: loading and timing")
    samples.append(probe.sample("before transformers"))
    res = run_transformers(cfg.model_dir, prompt, cfg.gen_len, cfg.hf_dtype)
    samples.append(probe.sample("after transformers"))
    if "skipped" in res:
        log(f"transformers: skipped: {res['skipped']}")
    return {"transformers": res}


def _ratios(timing: GenTiming, timings: dict[str, list[GenTiming]], base: dict[str, Any],
            bw: dict[str, Any], gemm: dict[str, Any]) -> dict[str, Any]:
    """fp8serve / each reference; against an engine timed in the rounds, the median of
    the per-round ratios (and the rounds' own under ``<name>_per_round``)."""
    from bench.generate.rounds import round_ratios

    ratios: dict[str, Any] = {
        "decode_vs_bandwidth_bound": timing.decode_tps / bw["decode_tok_s"],
        "decode_vs_torch_sum_bound": timing.decode_tps / bw["torch_sum_decode_tok_s"],
        "prefill_vs_bf16_matmul": timing.prefill_tps / gemm["prefill_tok_s"]}
    for name, res in base.items():
        if name in timings:
            rr = round_ratios(timings["fp8serve"], timings[name])
            ratios[f"decode_vs_{name}"] = rr["decode_median"]
            ratios[f"prefill_vs_{name}"] = rr["prefill_median"]
            ratios[f"{name}_per_round"] = rr
            continue
        ratios[f"decode_vs_{name}"] = _ratio(timing.decode_tps, res.get("decode_tok_s"))
        ratios[f"prefill_vs_{name}"] = _ratio(timing.prefill_tps, res.get("prefill_tok_s"))
    return ratios


def _result(cfg: GenerateBenchConfig, mcfg: Any, threads: int, timing: GenTiming,
            ours: dict[str, Any], bytes_tok: dict[str, Any], bw: dict[str, Any],
            samples: list[dict[str, Any]], gemm: dict[str, Any], base: dict[str, Any],
            ratios: dict[str, Any]) -> dict[str, Any]:
    """The JSON of run_generate_bench (every figure measured in that run)."""
    return {
        "schema": 1, "host": _host(threads),
        "config": {k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(cfg).items()},
        "model": {"dir": str(cfg.model_dir), "name": cfg.model_dir.name,
                  "num_layers": mcfg.num_layers, "hidden_size": mcfg.hidden_size,
                  "intermediate_size": mcfg.intermediate_size,
                  "vocab_size": mcfg.vocab_size, "tied": mcfg.tie_word_embeddings},
        "read_bandwidth_gbps": bw["gbps"], "read_bandwidth_probe": bw["probe"],
        "torch_sum_bandwidth_gbps": bw["torch_sum_gbps"], "read_bandwidth_samples": samples,
        "bytes_per_token": bytes_tok, "fp8serve": timing.to_dict() | ours,
        "bandwidth_bound": {"decode_tok_s": bw["decode_tok_s"],
                            "torch_sum_decode_tok_s": bw["torch_sum_decode_tok_s"],
                            "formula": "read_bandwidth / bytes_per_token.total"},
        "bf16_matmul": gemm, "baselines": base, "ratios": ratios,
        "agreement_tokens": {n: _agreement(timing.output_ids, r.get("output_ids"))
                             for n, r in base.items()},
    }
