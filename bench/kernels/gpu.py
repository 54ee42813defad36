"""The FP8 kernel benchmark on a CUDA device: every CUDA kernel the registry has
(cuda_scaled_mm_w8a8, cuda_torch_w8a16) against, in the same process and on the same
device, torch BF16 matmul on the dequantized weight and the HBM read-bandwidth bound
(FP8 weight bytes / read bandwidth measured with a large on-device sum).

Timing: CUDA events around ``reps`` calls after a warm-up; each call uses the next of
several distinct weights (together > 2x the L2 cache), so weights stream from HBM.
By default eager launches: at small M the Python dispatch and launch overhead is part of
the figure. ``--cuda-graphs`` replays each call from a captured graph instead, which
leaves the device time alone.

Row fields (JSON): shape, n, k, m, kernel, time_us, tflops, weight_gbps (weight bytes /
time), vs_bf16 (bf16 time / this time: > 1 is faster), pct_of_bound (FP8 weight read time
at the measured bandwidth / time * 100; for the bf16 row, of its own 2-byte weight).

    python -m bench.kernels.gpu [--json OUT] [--ms 1 16 128 512 2048]
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict, dataclass
from typing import Any

import torch

from bench.common.timing import copies_to_exceed
from bench.kernels.cpu import BF16, MINISTRAL_3_8B, Shape
from engine.kernels.base import ScaleKind
from engine.kernels.reference import dequantize, random_fp8_weight
from engine.kernels.registry import get_kernel

CUDA_KERNELS = ("cuda_scaled_mm_w8a8", "cuda_torch_w8a16")


@dataclass(frozen=True, slots=True)
class GpuRow:
    shape: str
    n: int
    k: int
    m: int
    kernel: str
    time_us: float
    tflops: float
    weight_gbps: float
    vs_bf16: float | None
    pct_of_bound: float


def device_read_bandwidth(nbytes: int = 4 << 30, reps: int = 10) -> float:
    """HBM read bandwidth in GB/s: best of ``reps`` sums over one fp32 buffer."""
    buf = torch.ones(nbytes // 4, dtype=torch.float32, device="cuda")
    best = min(_time_us([buf.sum], 1) for _ in range(reps))
    del buf
    torch.cuda.empty_cache()
    return nbytes / (best * 1e-6) / 1e9


def as_graphs(fns: list) -> list:
    """Each call captured once in a CUDA graph (after a warm-up on a side stream, which
    also allocates any scratch); the returned callables replay them, so the timing is
    the device time without Python dispatch and launch overhead."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for fn in fns:
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graphs = []
    for fn in fns:
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        graphs.append(g.replay)
    return graphs


def _time_us(fns: list, reps: int, warmup: int = 3, graphs: bool = False) -> float:
    """Mean microseconds per call over ``reps`` calls cycling through ``fns``."""
    if graphs:
        fns = as_graphs(fns)
    for i in range(warmup):
        fns[i % len(fns)]()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for i in range(reps):
        fns[i % len(fns)]()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) * 1e3 / reps


def _copies(nbytes: int) -> int:
    """Distinct weights that together exceed 2x the device's L2 cache (at most 16)."""
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 64 << 20)
    return copies_to_exceed(nbytes, l2, max_copies=16)


def bench_shape(shape: Shape, ms: tuple[int, ...], bw_gbps: float, reps: int,
                graphs: bool = False) -> list[GpuRow]:
    n, k = shape.n, shape.k
    copies = _copies(n * k)
    weights = [random_fp8_weight(n, k, ScaleKind.PER_TENSOR, seed=i) for i in range(copies)]
    rows: list[GpuRow] = []
    bf16_w = [dequantize(w).to(torch.bfloat16).cuda() for w in weights[:max(2, copies // 2)]]
    per_kernel = {kid: (get_kernel(kid), []) for kid in CUDA_KERNELS}
    for kern, packed in per_kernel.values():
        packed.extend(kern.prepare(w) for w in weights)
    for m in ms:
        x = torch.randn(m, k, device="cuda").to(torch.bfloat16)
        t_bf16 = _time_us([lambda w=w, x=x: torch.nn.functional.linear(x, w) for w in bf16_w], reps,
                          graphs=graphs)
        rows.append(_row(shape, m, BF16, t_bf16, None, 2 * n * k, bw_gbps))
        for kid, (kern, packed) in per_kernel.items():
            t = _time_us([lambda p=p, kern=kern, x=x: kern.apply(p, x) for p in packed], reps,
                         graphs=graphs)
            rows.append(_row(shape, m, kid, t, t_bf16 / t, n * k, bw_gbps))
    return rows


def _row(shape: Shape, m: int, kernel: str, t_us: float, vs_bf16: float | None,
         weight_bytes: int, bw_gbps: float) -> GpuRow:
    bound_us = weight_bytes / (bw_gbps * 1e9) * 1e6
    return GpuRow(shape.name, shape.n, shape.k, m, kernel, round(t_us, 2),
                  round(2 * m * shape.n * shape.k / (t_us * 1e-6) / 1e12, 2),
                  round(weight_bytes / (t_us * 1e-6) / 1e9, 1),
                  None if vs_bf16 is None else round(vs_bf16, 3),
                  round(bound_us / t_us * 100, 1))


def format_table(rows: list[GpuRow]) -> str:
    head = f"{'shape':<18}{'M':>6}  {'kernel':<22}{'us':>10}{'TFLOP/s':>9}{'GB/s':>8}" \
           f"{'x bf16':>8}{'% bound':>9}"
    lines = [head]
    for r in rows:
        vs = "-" if r.vs_bf16 is None else f"{r.vs_bf16:.2f}"
        lines.append(f"{r.shape:<18}{r.m:>6}  {r.kernel:<22}{r.time_us:>10.1f}"
                     f"{r.tflops:>9.1f}{r.weight_gbps:>8.0f}{vs:>8}{r.pct_of_bound:>9.1f}")
    return "\n".join(lines)


def run(ms: tuple[int, ...], reps: int, graphs: bool = False) -> dict[str, Any]:
    if not torch.cuda.is_available():
        raise SystemExit("gpu_kernel_bench: no CUDA device visible to torch")
    bw = device_read_bandwidth()
    rows = [r for s in MINISTRAL_3_8B for r in bench_shape(s, ms, bw, reps, graphs)]
    return {"device": torch.cuda.get_device_name(0),
            "capability": list(torch.cuda.get_device_capability(0)),
            "torch": torch.__version__, "cuda_graphs": graphs, "read_bandwidth_gbps": round(bw, 1),
            "rows": [asdict(r) for r in rows]}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ms", type=int, nargs="+", default=[1, 16, 128, 512, 2048])
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--cuda-graphs", action="store_true",
                   help="replay each call from a CUDA graph: device time, no launch overhead")
    p.add_argument("--json", help="write the result here")
    args = p.parse_args(argv)
    result = run(tuple(args.ms), args.reps, args.cuda_graphs)
    print(f"{result['device']} (capability {result['capability']}), torch {result['torch']}, "
          f"read bandwidth {result['read_bandwidth_gbps']} GB/s, "
          f"{'CUDA graphs' if args.cuda_graphs else 'eager launches'}")
    print(format_table([GpuRow(**r) for r in result["rows"]]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
