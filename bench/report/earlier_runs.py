"""Charts of the earlier runs transcribed into docs/performance.md ("Earlier runs"), for
the host classes whose figures predate bench/run_all.sh's JSON: each figure below is copied
from those tables (a per-round list gives its median round), with its source beside it.

    python -m bench.report.earlier_runs [--img docs/img]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench.report.charts import plot_decode, plot_kernel_ratios

# AVX-512 (AMD EPYC Zen 5, 2 threads, 2026-11-30): `fp8serve bench kernels`, fastest FP8
# kernel (avx512_w8a16) over torch bf16 matmul per (shape, M)
AVX512_KERNELS = [
    (shape, m, r) for shape, ratios in (
        ("down_proj", (6.40, 2.79, 1.54, 1.05, 1.04)),
        ("gate_proj/up_proj", (3.85, 2.38, 1.42, 1.01, 1.01)),
        ("k_proj/v_proj", (4.82, 3.00, 1.65, 1.08, 1.05)),
        ("q_proj/o_proj", (4.10, 2.43, 1.48, 1.04, 1.01)),
    ) for m, r in zip((1, 8, 32, 128, 512), ratios, strict=True)]


def _run(name: str, prompt: int, ours: float, bound: float | None = None,
         **baselines: tuple[str, float]) -> dict[str, Any]:
    """The keys of a `fp8serve bench generate` result that the decode chart reads."""
    return {"model": {"name": name}, "config": {"prompt_len": prompt},
            "host": {"torch_threads": 2}, "fp8serve": {"decode_tok_s": ours},
            "bandwidth_bound": {"decode_tok_s": bound} if bound else None,
            "baselines": {k: {"decode_tok_s": v, "dtype": d} for k, (d, v) in baselines.items()}}


# AVX-512, the same runs: `fp8serve bench generate`, prompt 512
AVX512_DECODE = [
    _run("demo-smollm2-135m-fp8", 512, 143.9, 213.0, llamacpp_q4_1=("", 85.1),
         transformers=("float32", 15.0)),
    _run("ministral-3-3b shape", 512, 8.8, 9.5),
]
# AVX-512 (AMD EPYC Zen 5, 2 threads, 2026-12-04): against llama.cpp built for the host
# (-march=native), the median round of `fp8serve bench generate --baselines llamacpp
# --rounds 3` (demo: Q4_1; 3B, 8B shapes: --gguf-types Q8_0)
AVX512_NATIVE_DECODE = [
    _run("demo-smollm2-135m-fp8", 512, 223.5, 286.9, llamacpp_q4_1=("", 146.4)),
    _run("3B shape (synth)", 512, 12.37, 12.4, llamacpp_q8_0=("", 10.51)),
    _run("8B shape (synth)", 128, 5.79, llamacpp_q8_0=("", 4.53)),
]
# AVX2 (AMD EPYC Zen 2, 2 threads, 2026-12-01): fp8serve against llama.cpp Q8_0, the median
# round of `fp8serve bench generate --baselines llamacpp --gguf-types Q8_0 --rounds 3`
AVX2_DECODE = [
    _run("3B shape (synth)", 128, 5.91, llamacpp_q8_0=("", 5.56)),
    _run("3B shape (synth)", 512, 6.69, llamacpp_q8_0=("", 5.65)),
    _run("8B shape (synth)", 128, 3.27, llamacpp_q8_0=("", 2.54)),
]
CHARTS = {
    "kernels-avx512-2026-11-30.png": lambda p: plot_kernel_ratios(
        AVX512_KERNELS, "avx512_w8a16 over torch bf16 matmul (Ministral-3-8B shapes; "
        "AMD EPYC Zen 5, 2 threads, 2026-11-30)", p),
    "decode-avx512-2026-11-30.png": lambda p: plot_decode(AVX512_DECODE, p),
    "decode-avx2-2026-12-01.png": lambda p: plot_decode(AVX2_DECODE, p),
    "decode-avx512-2026-12-04.png": lambda p: plot_decode(AVX512_NATIVE_DECODE, p),
}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.report.earlier_runs", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--img", type=Path, default=Path("docs/img"))
    args = p.parse_args(argv)
    for name, draw in CHARTS.items():
        why = draw(args.img / name)
        print(f"{args.img / name}: {why or 'written'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
