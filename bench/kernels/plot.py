"""PNG plot of kernel-benchmark rows. matplotlib is optional: without it, plot_rows
returns a message instead of a file."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def plot_rows(rows: list[dict[str, Any]], path: Path) -> str | None:
    """One panel per shape: time per call (ms, log) against M (log), a line per kernel
    and baseline, the bandwidth bound dashed. Returns None on success, else why not."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed (pip install matplotlib); skipped the plot"
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    if not shapes:
        return "no rows to plot"
    fig, axes = plt.subplots(1, len(shapes), figsize=(4.5 * len(shapes), 4), squeeze=False)
    for ax, shape in zip(axes[0], shapes, strict=True):
        mine = [r for r in rows if r["shape"] == shape]
        for kernel in dict.fromkeys(r["kernel"] for r in mine):
            pts = sorted((r["m"], r["time_ms"]) for r in mine if r["kernel"] == kernel)
            style = "--o" if any(r["role"] == "baseline" for r in mine
                                 if r["kernel"] == kernel) else "-o"
            ax.plot([p[0] for p in pts], [p[1] for p in pts], style, label=kernel, ms=3)
        ax.axhline(mine[0]["bound_ms"], color="gray", ls=":", label="bandwidth bound")
        ax.set(xscale="log", yscale="log", xlabel="M (tokens)", ylabel="ms per call",
               title=f"{shape} [{mine[0]['n']}x{mine[0]['k']}]")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return None
