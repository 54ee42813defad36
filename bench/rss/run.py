"""Peak resident memory of `fp8serve serve` for a model, against what it must hold: the
weight bytes on disk of what the server loaded (the text decoder; the vision tower and
projector too when it serves images, which its GET /kernels ``vision`` says: a multimodal
checkpoint loads them unless ``--limit-mm-per-prompt image=0``) plus the preallocated KV
cache (``kv_cache_gib``).

The server runs in its own subprocess; a few requests go through it (bench/serve/run.py
drives them), then its peak is read from ``/proc/<pid>/status`` ``VmHWM`` (the high-water
mark of that process alone; ``ru_maxrss`` of a child would include the parent's peak from
before the exec)."""

from __future__ import annotations

import asyncio
import json
import struct
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from bench.common.server_process import free_port, stop, wait_ready

REPO_ROOT = Path(__file__).resolve().parents[2]
VISION_MARKERS = ("vision_tower", "multi_modal_projector", "vision_encoder",
                  "vision_language_adapter", "patch_merger", "pre_mm_projector_norm")
GIB = 2**30


@dataclass(frozen=True)
class RssBenchConfig:
    model_dir: Path
    kv_cache_gib: float = 1.0
    max_num_seqs: int = 16
    max_model_len: int = 4096
    threads: int | None = None
    limit_mm_per_prompt: int | None = None  # serve's --limit-mm-per-prompt (None: default)
    requests: int = 8  # requests driven through the server before reading the peak
    concurrency: int = 4
    prompt_len: int = 128
    max_tokens: int = 32
    startup_timeout_s: float = 900.0

    def __post_init__(self) -> None:
        if self.kv_cache_gib <= 0 or min(self.requests, self.concurrency,
                                         self.prompt_len, self.max_tokens) < 1:
            raise ValueError("need kv_cache_gib > 0 and requests, concurrency, prompt_len, "
                             "max_tokens >= 1")


def proc_memory(pid: int | str = "self") -> dict[str, int]:
    """VmHWM, VmRSS, RssAnon, RssFile, RssShmem of ``pid`` in bytes (absent keys omitted)."""
    out: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile", "RssShmem"):
            out[key] = int(value.split()[0]) * 1024  # reported in kB
    return out


def _safetensors_sizes(path: Path) -> dict[str, int]:
    """Tensor name -> data bytes, from the file's JSON header (no tensor data read)."""
    with path.open("rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {k: v["data_offsets"][1] - v["data_offsets"][0]
            for k, v in header.items() if k != "__metadata__"}


def weight_bytes_on_disk(model_dir: Path) -> dict[str, int]:
    """Bytes of tensor data in every *.safetensors file of ``model_dir``: all of them, the
    text decoder's (names without a vision marker) and the vision tower + projector's."""
    total = text = 0
    for f in sorted(Path(model_dir).glob("*.safetensors")):
        for name, size in _safetensors_sizes(f).items():
            total += size
            text += 0 if any(m in name for m in VISION_MARKERS) else size
    return {"all_tensors": total, "text_decoder": text, "vision": total - text}


def server_command(cfg: RssBenchConfig, port: int) -> list[str]:
    cmd = [sys.executable, "-m", "cli.main", "--log-level", "WARNING", "serve", "--model",
           str(cfg.model_dir), "--port", str(port), "--kv-cache-gib", str(cfg.kv_cache_gib),
           "--max-num-seqs", str(cfg.max_num_seqs), "--max-model-len", str(cfg.max_model_len)]
    if cfg.limit_mm_per_prompt is not None:
        cmd += ["--limit-mm-per-prompt", f"image={cfg.limit_mm_per_prompt}"]
    return cmd + (["--threads", str(cfg.threads)] if cfg.threads else [])


def served_vision(url: str) -> dict[str, Any]:
    """The server's GET /kernels ``vision`` part: images served (with the tower's size) or
    why not."""
    import httpx

    r = httpx.get(url + "/kernels", timeout=30)
    r.raise_for_status()
    return dict(r.json().get("vision") or {"images": False, "reason": "not reported"})


def drive(url: str, cfg: RssBenchConfig, vocab_size: int) -> dict[str, Any]:
    from bench.serve.config import BenchConfig
    from bench.serve.run import run_bench

    hi = min(20000, vocab_size)
    bcfg = BenchConfig(url, cfg.concurrency, cfg.requests, cfg.prompt_len, cfg.max_tokens,
                       vocab_lo=min(1000, hi // 2), vocab_hi=hi)
    return asyncio.run(run_bench(bcfg))


def interpreter_baseline() -> dict[str, int]:
    """Peak RSS of a bare interpreter that imports torch and the service (no model)."""
    code = ("import torch, service.app, engine.runner; from pathlib import Path; "
            "print(Path('/proc/self/status').read_text())")
    text = subprocess.run([sys.executable, "-c", code], cwd=REPO_ROOT, check=True,
                          capture_output=True, text=True).stdout
    return {k: int(v.split()[0]) * 1024 for k, _, v in
            (ln.partition(":") for ln in text.splitlines()) if k in ("VmHWM", "VmRSS")}


def _summary(cfg: RssBenchConfig, weights: dict[str, int], mem: dict[str, dict[str, int]],
             load: dict[str, Any], ready_s: float, vision: dict[str, Any]) -> dict[str, Any]:
    loaded = weights["text_decoder"] + (weights["vision"] if vision.get("images") else 0)
    budget = loaded + cfg.kv_cache_gib * GIB
    peak = mem["after_requests"]["VmHWM"]
    return {"schema": 1, "config": {k: (str(v) if isinstance(v, Path) else v)
                                    for k, v in asdict(cfg).items()},
            "model": Path(cfg.model_dir).name, "weight_bytes": weights,
            "vision": vision, "loaded_weight_bytes": loaded,
            "kv_cache_bytes": int(cfg.kv_cache_gib * GIB), "budget_bytes": int(budget),
            "memory": mem, "peak_rss_bytes": peak, "peak_rss_gib": peak / GIB,
            "budget_gib": budget / GIB, "overhead_gib": (peak - budget) / GIB,
            "peak_vs_budget": peak / budget, "ready_s": ready_s,
            "requests": {"completed": load["completed"], "failed": load["failed"],
                         "output_tokens": load["total_output_tokens"]},
            "interpreter_baseline": interpreter_baseline()}


def run_rss_bench(cfg: RssBenchConfig, log: Any = print) -> dict[str, Any]:
    """Start the server, sample its memory once ready and after the requests, stop it."""
    from engine.loader import read_model_config

    vocab = read_model_config(Path(cfg.model_dir)).vocab_size
    weights = weight_bytes_on_disk(cfg.model_dir)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_file = tempfile.NamedTemporaryFile("w+", prefix="fp8serve-rss-", suffix=".log",
                                           delete=False)
    proc = subprocess.Popen(server_command(cfg, port), cwd=REPO_ROOT, stdout=log_file,
                            stderr=subprocess.STDOUT)
    try:
        log(f"server pid {proc.pid} on {url}; waiting for /health (log {log_file.name})")
        ready_s = wait_ready(url, proc, cfg.startup_timeout_s, Path(log_file.name))
        mem = {"ready": proc_memory(proc.pid)}
        vision = served_vision(url)
        log(f"ready in {ready_s:.1f} s; {cfg.requests} requests at concurrency "
            f"{cfg.concurrency}")
        load = drive(url, cfg, vocab)
        mem["after_requests"] = proc_memory(proc.pid)
    finally:
        stop(proc)
    return _summary(cfg, weights, mem, load, ready_s, vision)
