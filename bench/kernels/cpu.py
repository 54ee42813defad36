"""The FP8 kernel benchmark: every available CPU kernel against, in the same process,
torch BF16 matmul on the dequantized weight, torch._scaled_mm (W8A8, what vLLM falls back
to), and the memory-bandwidth bound (FP8 weight bytes / measured read bandwidth).

Each timed call uses the next of several distinct weights (together > 2x the last-level
cache), so the weight streams from memory as it does in a real forward pass.

Row fields (JSON): shape, n, k, m, kernel, role ("kernel" | "baseline"), time_ms,
weight_bytes (bytes of weight the call reads: N*K fp8, 2*N*K bf16), gbps (weight_bytes /
time), tflops (2*M*N*K / time), bound_ms (N*K / read bandwidth), pct_of_bound (bound_ms /
time_ms * 100), vs_bf16 (bf16 time / this time: > 1 is faster), vs_scaled_mm (likewise;
null where _scaled_mm was not run at this M).
"""

from __future__ import annotations

import platform as _platform
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from typing import Any

import torch

from bench.common.timing import copies_to_exceed, llc_bytes, measure_read_bandwidth, time_calls
from engine.hardware import HardwareInfo
from engine.kernels.base import FP8_DTYPE, Fp8Spec, Fp8Weight, Platform, ScaleKind
from engine.kernels.reference import dequantize
from engine.kernels.registry import DEFAULT_CATALOG, KernelCatalog, hardware_reason

BF16 = "torch_bf16_matmul"
SCALED_MM = "torch_scaled_mm_w8a8"


@dataclass(frozen=True, slots=True)
class Shape:
    name: str
    n: int
    k: int


MINISTRAL_3_8B = (
    Shape("q_proj/o_proj", 4096, 4096),
    Shape("k_proj/v_proj", 1024, 4096),
    Shape("gate_proj/up_proj", 14336, 4096),
    Shape("down_proj", 4096, 14336),
)


@dataclass(frozen=True)
class KernelBenchConfig:
    shapes: tuple[Shape, ...] = MINISTRAL_3_8B
    ms: tuple[int, ...] = (1, 8, 32, 128, 512)
    kernels: tuple[str, ...] | None = None  # None: every CPU kernel this host can run
    scale_kind: ScaleKind = ScaleKind.PER_TENSOR
    reps: int = 20
    seconds_per_point: float = 2.0  # fewer reps where one call is slow
    # torch._scaled_mm upcasts to fp32 on every call on CPUs without AMX (~60 ms per
    # 4096x4096 GEMV here): measured at fewer M values and with fewer reps.
    scaled_mm_ms: tuple[int, ...] = (1, 32)
    scaled_mm_reps: int = 3
    # torch._scaled_mm is a reference loop on some hosts (~15 M MAC/s on an AMX Xeon: two
    # minutes for one 14336x4096 call at M = 32): an M whose call would exceed this many
    # seconds (from the smaller M's time) is listed as skipped, not timed
    max_seconds_per_call: float = 5.0
    bandwidth_bytes: int = 1 << 30
    rotate_factor: float = 2.0  # distinct weights together exceed this x the LLC
    seed: int = 0
    # torch intra-op threads (torch.set_num_threads) the kernels, the baselines and the
    # bandwidth probe run on, as the model's --threads; None: torch's (all cores)
    threads: int | None = None

    def __post_init__(self) -> None:
        if not self.shapes or not self.ms or min(self.ms) < 1 or self.reps < 1:
            raise ValueError("need shapes, M values >= 1 and reps >= 1")
        if self.threads is not None and self.threads < 1:
            raise ValueError("--threads must be >= 1")
        if not self.max_seconds_per_call > 0:
            raise ValueError("--max-seconds-per-call must be > 0")

    def quick(self) -> KernelBenchConfig:
        """A smoke run: two M values, 3 reps, 64 MiB bandwidth probe, 1 _scaled_mm call
        (at the first M, unless --scaled-mm-m '' left it out)."""
        return replace(self, ms=self.ms[:2], reps=3, seconds_per_point=0.2,
                       scaled_mm_ms=self.ms[:1] if self.scaled_mm_ms else (),
                       scaled_mm_reps=1,
                       bandwidth_bytes=64 << 20, rotate_factor=0.0)


@dataclass
class BenchResult:
    host: dict[str, Any]
    read_bandwidth_gbps: float
    llc_bytes: int
    config: dict[str, Any]
    rows: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"schema": 1, **asdict(self)}


def random_fp8_layer(shape: Shape, kind: ScaleKind, gen: torch.Generator) -> Fp8Weight:
    """Random e4m3 codes (NaN codes zeroed) with a small scale: timing data, not accuracy.
    Block scales: 128 x 128 blocks."""
    codes = torch.randint(0, 256, (shape.n, shape.k), dtype=torch.uint8, generator=gen)
    codes[(codes & 0x7F) == 0x7F] = 0
    n_scales = {ScaleKind.PER_TENSOR: (), ScaleKind.PER_CHANNEL: (shape.n,),
                ScaleKind.BLOCK: (-(-shape.n // 128), -(-shape.k // 128))}[kind]
    scale = torch.full(n_scales, 1e-3, dtype=torch.float32)
    return Fp8Weight(codes.view(FP8_DTYPE), scale, kind, torch.tensor(0.05), (128, 128))


def _kernel_ids(cfg: KernelBenchConfig, catalog: KernelCatalog) -> list[str]:
    if cfg.kernels is not None:
        return list(cfg.kernels)
    return [k for k in catalog.table(Platform.CPU, cfg.scale_kind) if k != SCALED_MM]


def _host(hw: HardwareInfo) -> dict[str, Any]:
    return {"machine": hw.machine or _platform.machine(), "cpu_model": hw.cpu_model,
            "num_cpus": hw.num_cpus, "threads": torch.get_num_threads(),
            "features": hw.feature_map(), "torch": torch.__version__}


class _ShapeRun:
    """One shape: its rotated weights and the rows measured on it."""

    def __init__(self, shape: Shape, cfg: KernelBenchConfig, copies: int, bw: float) -> None:
        gen = torch.Generator().manual_seed(cfg.seed)
        self.shape, self.cfg, self.bw = shape, cfg, bw
        self.weights = [random_fp8_layer(shape, cfg.scale_kind, gen) for _ in range(copies)]
        self.bound_s = shape.n * shape.k / (bw * 1e9)

    def x(self, m: int) -> torch.Tensor:
        gen = torch.Generator().manual_seed(m)
        return torch.randn(m, self.shape.k, generator=gen).to(torch.bfloat16)

    def time(self, fns: list[Callable[[], object]], reps: int) -> float:
        first = time_calls(fns[:1], reps=1, warmup=1)
        budget = max(1, int(self.cfg.seconds_per_point / max(first, 1e-9)))
        return time_calls(fns, reps=max(1, min(reps, budget)), warmup=0)

    def row(self, m: int, kernel: str, role: str, seconds: float, wbytes: int) -> dict[str, Any]:
        s = self.shape
        return {"shape": s.name, "n": s.n, "k": s.k, "m": m, "kernel": kernel, "role": role,
                "time_ms": seconds * 1e3, "weight_bytes": wbytes,
                "gbps": wbytes / seconds / 1e9, "tflops": 2 * m * s.n * s.k / seconds / 1e12,
                "bound_ms": self.bound_s * 1e3, "pct_of_bound": self.bound_s / seconds * 100}


def _bench_bf16(run: _ShapeRun, rows: list[dict[str, Any]]) -> None:
    s = run.shape
    mats = [dequantize(w).to(torch.bfloat16) for w in run.weights]  # any scale kind
    for m in run.cfg.ms:
        x = run.x(m)
        t = run.time([partial(torch.mm, x, w.t()) for w in mats], run.cfg.reps)
        rows.append(run.row(m, BF16, "baseline", t, 2 * s.n * s.k))


def _bench_kernel(run: _ShapeRun, kernel: Any, role: str, ms: tuple[int, ...], reps: int,
                  res: BenchResult) -> None:
    """Times ``kernel`` at each M; an M whose call would take longer than
    cfg.max_seconds_per_call (one call at a smaller M, scaled by the M ratio: a reference
    loop, e.g. torch._scaled_mm on some hosts) is left out and listed in res.skipped."""
    packed = [kernel.prepare(w) for w in run.weights]
    last: tuple[int, float] | None = None
    for m in sorted(ms):
        if last is not None and last[1] * m / last[0] > run.cfg.max_seconds_per_call:
            est = last[1] * m / last[0]
            res.skipped.append({"kernel": kernel.id, "shape": run.shape.name, "reason": (
                f"not timed at M={m}: one call at M={last[0]} took {last[1]:.2f} s, about "
                f"{est:.0f} s at M={m} (over --max-seconds-per-call "
                f"{run.cfg.max_seconds_per_call:g})")})
            continue
        x = run.x(m)
        t = run.time([partial(kernel.apply, p, x) for p in packed], reps)
        res.rows.append(run.row(m, kernel.id, role, t, run.shape.n * run.shape.k))
        last = (m, t)


def _add_ratios(rows: list[dict[str, Any]]) -> None:
    base = {(r["shape"], r["m"], r["kernel"]): r["time_ms"] for r in rows}
    for r in rows:
        bf16 = base.get((r["shape"], r["m"], BF16))
        smm = base.get((r["shape"], r["m"], SCALED_MM))
        r["vs_bf16"] = None if bf16 is None else bf16 / r["time_ms"]
        r["vs_scaled_mm"] = None if smm is None else smm / r["time_ms"]


def _usable(kid: str, shape: Shape, cfg: KernelBenchConfig, hw: HardwareInfo,
            catalog: KernelCatalog) -> tuple[Any | None, str | None]:
    reason = hardware_reason(kid, hw, catalog)
    if reason is None:
        kernel = catalog.load(kid).kernel
        spec = Fp8Spec(shape.n, shape.k, cfg.scale_kind, has_activation_scale=True)
        reason = kernel.can_implement(spec)  # type: ignore[union-attr]
        if reason is None:
            return kernel, None
    return None, reason


def run_kernel_bench(cfg: KernelBenchConfig, hw: HardwareInfo,
                     catalog: KernelCatalog = DEFAULT_CATALOG,
                     log: Callable[[str], None] = lambda s: None) -> BenchResult:
    """Every kernel of ``cfg`` against the same-run baselines, at ``cfg.threads`` torch
    threads when given (set for the process, as the other benchmarks' --threads is)."""
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    bw = measure_read_bandwidth(cfg.bandwidth_bytes)
    llc = llc_bytes()
    log(f"read bandwidth {bw:.1f} GB/s; last-level cache {llc >> 20} MiB; "
        f"{torch.get_num_threads()} threads")
    res = BenchResult(_host(hw), bw, llc, _config_dict(cfg))
    smm_ms = [m for m in cfg.ms if m in cfg.scaled_mm_ms]
    res.notes.append(f"torch._scaled_mm measured only at M in {smm_ms} with at most "
                     f"{cfg.scaled_mm_reps} rep(s): it upcasts to fp32 on every call here"
                     if smm_ms else "torch._scaled_mm not measured (no --scaled-mm-m value "
                     "among --m)")
    for shape in cfg.shapes:
        copies = copies_to_exceed(shape.n * shape.k, llc, cfg.rotate_factor)
        log(f"{shape.name} [{shape.n}x{shape.k}]: rotating {copies} weights")
        run = _ShapeRun(shape, cfg, copies, bw)
        _bench_bf16(run, res.rows)
        smm, why = _usable(SCALED_MM, shape, cfg, hw, catalog)
        if smm is not None:
            ms = tuple(m for m in cfg.ms if m in cfg.scaled_mm_ms)
            _bench_kernel(run, smm, "baseline", ms, cfg.scaled_mm_reps, res)
        else:
            res.skipped.append({"kernel": SCALED_MM, "shape": shape.name, "reason": str(why)})
        for kid in _kernel_ids(cfg, catalog):
            kernel, why = _usable(kid, shape, cfg, hw, catalog)
            if kernel is None:
                res.skipped.append({"kernel": kid, "shape": shape.name, "reason": str(why)})
                continue
            _bench_kernel(run, kernel, "kernel", cfg.ms, cfg.reps, res)
    _add_ratios(res.rows)
    return res


def _config_dict(cfg: KernelBenchConfig) -> dict[str, Any]:
    d = asdict(cfg)
    d["scale_kind"] = cfg.scale_kind.value
    return d
