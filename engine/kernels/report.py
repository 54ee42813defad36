"""The kernel report: one JSON-able dict for `fp8serve kernels --json`, GET /kernels and
the kernel metrics.

Shape (every key always present; lists may be empty)::

    {
      "schema": 1,
      "platform": "cpu" | "xpu" | "cuda",          # the tables this host uses
      "hardware": {
        "machine": str, "cpu_model": str, "num_cpus": int,
        "dispatch_isa": str | null,                # ext.isa(), FP8SERVE_ISA may lower it
        "features": {feature: bool},               # HardwareInfo.feature_map()
        "xpu":  {"available": bool, "name": str | null},
        "cuda": {"available": bool, "capability": "8.9" | null, "name": str | null}
      },
      "extension": {"built": bool, "error": str | null, "path": str | null,
                    "compiler": str | null, "torch_version": str | null},
      "overrides": {"forced": str | null, "disabled": [str]},
      "tables": [                                  # trial order within each table
        {"name": "cpu/per_tensor", "platform": "cpu", "scale_kind": "per_tensor",
         "active": bool,
         "kernels": [{"kernel_id": str, "supported": bool, "reason": str | null,
                      "forced": bool, "disabled": bool, "batch_invariant": bool,
                      # the kernel its layers run generated rows on, where the host runs
                      # it (engine/kernels/amx.py), else null
                      "generated_rows_kernel": str | null}]}
        # ... and after the CPU FP8 tables "cpu/bf16" (scale_kind "bf16"): the bf16
        # linears' kernels (bf16_avx512, bf16_avx2, bf16_portable, torch_mm), active
      ],
      # per layer (KernelReport.snapshot(); empty without a model), the bf16 ones (a bf16
      # lm_head) with scale_kind "bf16":
      "layers": [{"layer": str, "kernel_id": str, "platform": str, "scale_kind": str,
                  "n": int, "k": int, "rejections": [{"kernel_id": str, "reason": str}],
                  "warning": str | null, "first_choice": str | null,
                  # the kernel of the layer's generated rows when it differs (prompt rows
                  # run kernel_id), else null
                  "generated_kernel_id": str | null}],
      "runtime_fallbacks": [{"layer": str, "from_kernel": str, "to_kernel": str,
                             "error": str,
                             "stage": "prepare" | "apply" | "apply (generated rows)"}],
      # per decoder layer: one fused C++ op (engine/model/decode_step.py) or the Python
      # layer, and why (empty without a model):
      "decoder_layers": [{"index": int, "path": "fused" | "python", "reason": str | null}],
      # the attention path (PagedAttention.describe; null without a model): the C++ paged
      # attention op, or torch SDPA (not batch-invariant) and why
      "attention": {"path": "paged" | "sdpa", "reason": str | null,
                    "batch_invariant": bool} | null,
      # every layer's kernel and the attention keep a row's bits whatever the batch
      # (greedy answers the same alone and batched); true without a model
      "batch_invariant": bool,
      # the metric series, pre-aggregated:
      "summary": {
        "selected":  [{"kernel": str, "platform": str, "scale_kind": str, "layers": int}],
        "rejections": [{"kernel": str, "reason": str, "layers": int}],
        "runtime_fallbacks": [{"from_kernel": str, "to_kernel": str, "count": int}],
        "decoder_layers": [{"path": str, "reason": str, "layers": int}],  # reason "" if fused
        "generated_rows": [{"kernel": str, "generated_kernel": str, "layers": int}]
      }
    }
"""

from __future__ import annotations

from dataclasses import asdict
from typing import Any

from engine.hardware import HardwareInfo
from engine.kernels.layer_kernel import KernelReport
from engine.kernels.registry import (
    DEFAULT_CATALOG,
    KernelCatalog,
    KernelOverrides,
    platform_for,
    table_infos,
)

SCHEMA_VERSION = 1


def hardware_dict(hw: HardwareInfo) -> dict[str, Any]:
    cap = hw.cuda_capability
    return {
        "machine": hw.machine,
        "cpu_model": hw.cpu_model,
        "num_cpus": hw.num_cpus,
        "dispatch_isa": hw.dispatch_isa,
        "features": hw.feature_map(),
        "xpu": {"available": hw.xpu_available, "name": hw.xpu_name},
        "cuda": {"available": hw.cuda_available,
                 "capability": None if cap is None else f"{cap[0]}.{cap[1]}",
                 "name": hw.cuda_name},
    }


def bf16_table_dict(hw: HardwareInfo, overrides: KernelOverrides) -> dict[str, Any]:
    """The bf16 linears' table (the lm_head, unquantized linears): engine/kernels/
    bf16_linear.py's priority, on the CPU wherever the decoder runs."""
    from engine.kernels.bf16_linear import BF16_SCALE_KIND, TORCH_KERNEL_ID, bf16_table

    return {"name": f"cpu/{BF16_SCALE_KIND}", "platform": "cpu", "scale_kind": BF16_SCALE_KIND,
            "active": True,
            "kernels": [{"kernel_id": k, "supported": why is None, "reason": why,
                         "forced": k == overrides.forced_bf16,
                         "disabled": k in overrides.disabled,
                         "batch_invariant": k != TORCH_KERNEL_ID,
                         "generated_rows_kernel": None}
                        for k, why in bf16_table(hw, overrides)]}


def tables_list(hw: HardwareInfo, overrides: KernelOverrides,
                catalog: KernelCatalog) -> list[dict[str, Any]]:
    tables = [{"name": t.name, "platform": t.platform, "scale_kind": t.scale_kind,
               "active": t.active, "kernels": [asdict(e) for e in t.entries]}
              for t in table_infos(hw, overrides, catalog)]
    at = max((i + 1 for i, t in enumerate(tables) if t["platform"] == "cpu"), default=0)
    return tables[:at] + [bf16_table_dict(hw, overrides)] + tables[at:]


def summary_dict(report: KernelReport) -> dict[str, list[dict[str, Any]]]:
    return {
        "selected": [{"kernel": k, "platform": p, "scale_kind": s, "layers": n}
                     for (k, p, s), n in sorted(report.selected_counts().items())],
        "rejections": [{"kernel": k, "reason": r, "layers": n}
                       for (k, r), n in sorted(report.rejection_counts().items())],
        "runtime_fallbacks": [{"from_kernel": f, "to_kernel": t, "count": n}
                              for (f, t), n in sorted(report.fallback_counts().items())],
        "decoder_layers": [{"path": p, "reason": r, "layers": n}
                           for (p, r), n in sorted(report.decoder_counts().items())],
        "generated_rows": [{"kernel": k, "generated_kernel": g, "layers": n}
                           for (k, g), n in sorted(report.generated_counts().items())],
    }


def build_kernel_report(hw: HardwareInfo, overrides: KernelOverrides | None = None,
                        report: KernelReport | None = None,
                        catalog: KernelCatalog = DEFAULT_CATALOG) -> dict[str, Any]:
    """The whole report (shape in the module docstring). ``report`` is the model's
    per-layer record (``ModelRunner.kernel_report``); None = no model loaded."""
    overrides = overrides or KernelOverrides()
    report = report or KernelReport()
    snap = report.snapshot()
    return {
        "schema": SCHEMA_VERSION,
        "platform": platform_for(hw).value,
        "hardware": hardware_dict(hw),
        "extension": asdict(hw.extension),
        "overrides": overrides.to_dict(),
        "tables": tables_list(hw, overrides, catalog),
        "layers": snap["layers"],
        "runtime_fallbacks": snap["runtime_fallbacks"],
        "decoder_layers": snap["decoder_layers"],
        "attention": snap["attention"],
        "batch_invariant": report.batch_invariant(catalog),
        "summary": summary_dict(report),
    }
