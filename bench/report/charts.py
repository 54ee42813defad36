"""The charts of docs/performance.md: single-stream decode of fp8serve against llama.cpp,
transformers and the bandwidth bound (from `fp8serve bench generate` JSON). The kernel
chart is bench/kernels/plot.py's. matplotlib is optional: without it a chart function
returns why it drew nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def decode_bars(run: dict[str, Any]) -> list[tuple[str, float]]:
    """(label, decode tok/s) of one generate run: fp8serve, every llama.cpp GGUF timed,
    transformers, then the bandwidth bound; baselines that were skipped are left out."""
    bars = [("fp8serve", run["fp8serve"]["decode_tok_s"])]
    for name, res in sorted(run["baselines"].items()):
        if name.startswith("llamacpp") and res.get("decode_tok_s"):
            quant = name.removeprefix("llamacpp").strip("_").upper()
            bars.append((f"llama.cpp {quant}".strip(), res["decode_tok_s"]))
    hf = run["baselines"].get("transformers", {})
    if hf.get("decode_tok_s"):
        bars.append((f"transformers ({hf.get('dtype', '?')})", hf["decode_tok_s"]))
    if run.get("bandwidth_bound"):
        bars.append(("bandwidth bound", run["bandwidth_bound"]["decode_tok_s"]))
    return bars


def plot_decode(runs: list[dict[str, Any]], path: Path) -> str | None:
    """One panel per model: decode tok/s of each engine and the bound, each bar labelled
    with its tok/s and fp8serve's ratio to it. Returns None on success, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib); skipped the chart"
    if not runs:
        return "no generate results to chart"
    fig, axes = plt.subplots(len(runs), 1, figsize=(7, 0.5 + 1.6 * len(runs)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        bars = decode_bars(run)
        ours = bars[0][1]
        labels, values = [b[0] for b in bars], [b[1] for b in bars]
        colors = ["white" if b[0] == "bandwidth bound" else "tab:gray" for b in bars]
        colors[0] = "tab:blue"
        ax.barh(labels, values, color=colors, edgecolor="black")
        for i, v in enumerate(values):
            tps = f"{v:.1f}" if v >= 20 else f"{v:.2f}"
            note = tps if i == 0 else f"{tps}  (fp8serve x{ours / v:.2f})"
            ax.text(v, i, " " + note, va="center", fontsize=8)
        ax.invert_yaxis()
        ax.set_xlim(0, max(values) * 1.45)
        ax.set_title(f"{run['model']['name']}: decode tok/s, prompt "
                     f"{run['config']['prompt_len']}, {run['host']['torch_threads']} threads",
                     fontsize=9)
        ax.tick_params(labelsize=8)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def plot_kernel_ratios(points: list[tuple[str, int, float]], title: str,
                       path: Path) -> str | None:
    """Grouped bars, one group per shape: the fastest FP8 kernel's speed over torch bf16
    matmul at each M, from (shape, M, ratio) points. None on success, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib); skipped the chart"
    shapes = list(dict.fromkeys(s for s, _, _ in points))
    ms = sorted({m for _, m, _ in points})
    width = 0.8 / len(ms)
    fig, ax = plt.subplots(figsize=(7, 3.2))
    for i, m in enumerate(ms):
        vals = {s: r for s, mm, r in points if mm == m}
        xs = [j + i * width for j, s in enumerate(shapes) if s in vals]
        ax.bar(xs, [vals[s] for s in shapes if s in vals], width, label=f"M = {m}")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(shapes))], shapes, fontsize=8)
    ax.set_ylabel("x torch bf16 matmul")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=len(ms))
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None
