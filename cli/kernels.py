"""`fp8serve kernels [--model DIR] [--json]`: hardware features, every kernel table with
supported/unsupported and why, the extension build, and with a model the per-layer choice
and rejections. The JSON is engine.kernels.report.build_kernel_report (GET /kernels).

Also the shared kernel-override flags: every command that builds a model calls
:func:`add_kernel_args` on its parser and :func:`overrides_from_args` on its args.
"""

from __future__ import annotations

import argparse
import json
from typing import Any

from cli.main import CliError
from engine.config import ROWS_BY_ROLE
from engine.config_flags import add_lm_head_arg


def add_kernel_args(parser: argparse.ArgumentParser) -> None:
    """--kernel ID (replaces FP8SERVE_KERNEL) and --disable-kernel ID[,ID] (repeatable,
    added to FP8SERVE_DISABLED_KERNELS)."""
    parser.add_argument("--kernel", default=None, metavar="ID[,ID]",
                        help="force this kernel where it can run: an FP8 table's id, a bf16 "
                             "one (lm_head, unquantized linears), or one of each "
                             "(env FP8SERVE_KERNEL); a layer it cannot run takes the "
                             "table's next, with a warning (logged once per reason)")
    parser.add_argument("--disable-kernel", action="append", default=[], metavar="ID[,ID]",
                        help="never use these kernels (env FP8SERVE_DISABLED_KERNELS)")


def overrides_from_args(args: argparse.Namespace, env: dict[str, str] | None = None):
    """-> engine.kernels.registry.KernelOverrides; unknown ids are a CliError."""
    from engine.kernels.registry import overrides_from

    try:
        return overrides_from(getattr(args, "kernel", None),
                              getattr(args, "disable_kernel", None), env)
    except ValueError as exc:
        raise CliError(str(exc)) from exc


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("kernels", help="show hardware features and kernel choices")
    p.add_argument("--model", default=None, metavar="DIR",
                   help="also load this checkpoint and show each layer's kernel")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    add_kernel_args(p)
    add_lm_head_arg(p)
    p.add_argument("--rows-by-role", choices=ROWS_BY_ROLE, default="auto",
                   help="with --model: as `fp8serve serve --rows-by-role` (auto: as a server "
                   "of the default --max-num-seqs, off)")
    p.set_defaults(func=run)


def _model_report(model_dir: str, hw: Any, overrides: Any, lm_head_dtype: str = "auto",
                  rows_by_role: str = "auto") -> Any:
    """Build the model (fusion included) and return its KernelReport."""
    from pathlib import Path

    from engine.config import EngineConfig

    try:
        from engine.runner import load_runner
    except ImportError as exc:
        raise CliError(f"--model needs the model runner: {exc}") from exc
    if not Path(model_dir).is_dir():
        raise CliError(f"--model {model_dir}: not a directory")
    # the smallest engine that builds the model: a few one-token KV blocks (16 MiB)
    # rows by role as a server of the default max_num_seqs decides (auto: off), not this
    # one-sequence engine
    config = EngineConfig(model_dir=Path(model_dir), max_num_seqs=1, max_model_len=16,
                          kv_cache_gib=1 / 64, kv_block_size=1, lm_head_dtype=lm_head_dtype,
                          rows_by_role="on" if rows_by_role == "on" else "off")
    try:
        runner = load_runner(model_dir, config, hw=hw, overrides=overrides)
    except CliError:
        raise
    except Exception as exc:  # noqa: BLE001 - one line for the operator, not a traceback
        raise CliError(f"cannot load {model_dir}: {exc}") from exc
    return runner.kernel_report


def run(args: argparse.Namespace, hw: Any = None) -> int:
    """``hw``: a HardwareInfo to use instead of probing this host (tests)."""
    from engine.hardware_probe import probe_hardware
    from engine.kernels.report import build_kernel_report

    overrides = overrides_from_args(args)
    try:
        hw = hw if hw is not None else probe_hardware()
    except ValueError as exc:  # FP8SERVE_ISA naming no level
        raise CliError(str(exc)) from None
    head = getattr(args, "lm_head_dtype", None) or "auto"
    rows = getattr(args, "rows_by_role", None) or "auto"
    layers = _model_report(args.model, hw, overrides, head, rows) if args.model else None
    report = build_kernel_report(hw, overrides, layers)
    print(json.dumps(report, indent=2) if args.json else format_report(report))
    return 0


def _features_lines(rep: dict[str, Any]) -> list[str]:
    hw = rep["hardware"]
    feats = hw["features"]
    on = " ".join(f for f, v in feats.items() if v) or "-"
    off = " ".join(f for f, v in feats.items() if not v) or "-"
    cuda = hw["cuda"]
    ext = rep["extension"]
    ext_line = (f"built ({ext['path']}, {ext['compiler'] or 'compiler ?'}); dispatch "
                f"{hw.get('dispatch_isa') or '?'} (the ISA its kernels run at; FP8SERVE_ISA "
                "lowers it)" if ext["built"] else f"not built: {ext['error']}")
    return [
        f"host: {hw['machine']} {hw['cpu_model']} ({hw['num_cpus']} cpus); "
        f"platform {rep['platform']}",
        f"features on : {on}",
        f"features off: {off}",
        f"xpu: {hw['xpu']['name'] if hw['xpu']['available'] else 'none'}; cuda: "
        + (f"{cuda['name']} (sm {cuda['capability']})" if cuda["available"] else "none"),
        f"extension: {ext_line}",
        f"overrides: forced={rep['overrides']['forced'] or '-'} "
        f"disabled={','.join(rep['overrides']['disabled']) or '-'}",
    ]


TABLE_LEGEND = (
    "\nkernel tables, in priority order: a layer runs the first kernel marked ok (runs "
    "here) that takes its shape; -- cannot run here, and says why. batch-invariant: a "
    "row's result never depends on the other rows of the batch (greedy answers stay the "
    "same alone or batched).")


def _table_lines(rep: dict[str, Any]) -> list[str]:
    out = [TABLE_LEGEND]
    for t in rep["tables"]:
        out.append(f"\n[{t['name']}]" + ("  (this host)" if t["active"] else ""))
        for i, e in enumerate(t["kernels"], 1):
            mark = "ok" if e["supported"] else "--"
            tag = " (forced)" if e["forced"] else ""
            exact = "batch-invariant" if e["batch_invariant"] else "NOT batch-invariant"
            why = "" if e["supported"] else f"  {e['reason']}"
            gen = e.get("generated_rows_kernel")
            rows = (f" (generated rows: {gen} with --rows-by-role on or --max-num-seqs 1)"
                    if gen and e["supported"] else "")
            out.append(f"  {i}. {mark} {e['kernel_id']} [{exact}]{tag}{rows}{why}")
    return out


def _layer_lines(rep: dict[str, Any]) -> list[str]:
    if not rep["layers"]:
        return []
    out = ["\nlayers:"]
    for c in rep["layers"]:
        gen = c.get("generated_kernel_id")
        rows = f" (generated rows: {gen})" if gen else ""
        out.append(f"  {c['layer']} [{c['n']}x{c['k']} {c['scale_kind']}] -> "
                   f"{c['kernel_id']}{rows}")
        out.extend(f"      passed over {r['kernel_id']}: {r['reason']}" for r in c["rejections"])
        if c["warning"]:
            out.append(f"      warning: {c['warning']}")
    out.append("\nsummary:")
    out.extend(f"  {s['layers']:4d} layers on {s['kernel']} ({s['scale_kind']})"
               for s in rep["summary"]["selected"])
    out.extend(f"  {g['layers']:4d} layers on {g['kernel']} run generated rows (decode, "
               f"drafts) on {g['generated_kernel']}"
               for g in rep["summary"].get("generated_rows", []))
    out.extend(f"  runtime fallback {f['from_kernel']} -> {f['to_kernel']}: {f['count']}"
               for f in rep["summary"]["runtime_fallbacks"])
    decoder = rep["decoder_layers"]
    if decoder:
        fused = sum(d["path"] == "fused" for d in decoder)
        out.append(f"  decoder layers: {fused} of {len(decoder)} as one fused C++ op")
        out.extend(f"  {d['layers']:4d} layers on the Python path: {d['reason']}"
                   for d in rep["summary"]["decoder_layers"] if d["path"] == "python")
    attention = rep.get("attention")
    if attention is not None:
        out.append("  attention: C++ paged attention (batch-invariant)"
                   if attention["path"] == "paged" else
                   f"  attention: torch SDPA, NOT batch-invariant: {attention['reason']}")
    out.append("  exactness: " + ("on (greedy answers the same alone and batched)"
                                  if rep.get("batch_invariant", True) else
                                  "OFF (a row's bits may change with its batch)"))
    return out


def format_report(rep: dict[str, Any]) -> str:
    """The text form of build_kernel_report's dict."""
    return "\n".join(_features_lines(rep) + _table_lines(rep) + _layer_lines(rep))
