"""Plain-text table of kernel-benchmark rows (see bench/kernels/cpu.py)."""

from __future__ import annotations

from typing import Any

COLUMNS = (
    ("shape", "{:<18}", "shape"),
    ("m", "{:>4}", "M"),
    ("kernel", "{:<22}", "kernel"),
    ("time_ms", "{:>9.3f}", "ms"),
    ("gbps", "{:>7.1f}", "GB/s"),
    ("tflops", "{:>7.3f}", "TFLOP/s"),
    ("vs_bf16", "{:>8}", "x bf16"),
    ("vs_scaled_mm", "{:>9}", "x smm"),
    ("pct_of_bound", "{:>8.1f}", "% bound"),
)


def _ratio(v: float | None) -> str:
    return "-" if v is None else f"{v:.2f}"


def _cell(row: dict[str, Any], key: str, fmt: str) -> str:
    v = row[key]
    if key in ("vs_bf16", "vs_scaled_mm"):
        return fmt.format(_ratio(v))
    return fmt.format(v)


def format_rows(rows: list[dict[str, Any]]) -> str:
    """One line per (shape, M, kernel), grouped by shape then M; baselines first."""
    head = " ".join(_pad(title, fmt) for _, fmt, title in COLUMNS)
    lines = [head, "-" * len(head)]
    order = sorted(rows, key=lambda r: (r["shape"], r["m"], r["role"] != "baseline",
                                        r["kernel"]))
    last = None
    for r in order:
        if last is not None and (r["shape"], r["m"]) != last:
            lines.append("")
        last = (r["shape"], r["m"])
        lines.append(" ".join(_cell(r, key, fmt) for key, fmt, _ in COLUMNS))
    return "\n".join(lines)


def _pad(title: str, fmt: str) -> str:
    width = int("".join(ch for ch in fmt.split(":")[1].split(".")[0] if ch.isdigit()) or 0)
    return title.ljust(width) if "<" in fmt else title.rjust(width)
