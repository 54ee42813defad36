"""Kernel metric families, built at scrape time from a kernel report snapshot
(``KernelReport.snapshot()``: ``{"layers": [...], "runtime_fallbacks": [...],
"decoder_layers": [...]}``, shapes in
engine/kernels/report.py).

    fp8serve_kernel_selected{kernel, platform, scale_kind}      layers on each kernel
    fp8serve_kernel_rejections{kernel, reason}                  layers that passed it over
    fp8serve_kernel_runtime_fallbacks_total{from_kernel, to_kernel}
    fp8serve_layer_group_kernel{layer_group, kernel}            layers of a group on a kernel
    fp8serve_layer_group_generated_rows_kernel{layer_group, kernel}
        layers of a group whose generated rows (decode, drafts) run another kernel than
        their prompt rows (kernel_id above): AMX hosts, engine/kernels/amx.py
    fp8serve_kernel_startup_fallbacks{layer_group, from_kernel, to_kernel}
        layers that did not get their first-choice kernel (the forced kernel, else the
        first one this host runs) when the model was loaded
    fp8serve_decoder_layers{path, reason}
        decoder layers running as one fused C++ op (path "fused", reason "") or as the
        Python layers (path "python", reason: why not fused, e.g. a kernel the op does not
        call, FP8SERVE_FUSED=0, or the op's runtime error)
    fp8serve_attention_path{path, reason}
        1 for the model's attention path: "paged" (the C++ op, reason "") or "sdpa"
        (torch SDPA, not batch-invariant; reason: a head shape the op does not take,
        FP8SERVE_FUSED=0, no extension)
    fp8serve_batch_invariant
        1 when every layer's kernel and the attention keep a row's bits whatever the
        batch (greedy answers the same alone and batched), else 0

A layer group is the last component of the layer name: ``qkv_proj``, ``o_proj``,
``gate_up_proj``, ``down_proj``, ``lm_head`` (``q_proj``, ``k_proj``, ... when a fused
projection could not be fused).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from engine.kernels.layer_kernel import GENERATED_ROWS_STAGE

P = "fp8serve_"
# a label value stays short: a runtime error's message can be long (a kernel's, in its
# rejection reason; the fused op's, in a decoder layer's reason)
_REASON_CHARS = 160


def layer_group(layer: str) -> str:
    """'model.layers.3.self_attn.qkv_proj' -> 'qkv_proj'; 'lm_head' -> 'lm_head'."""
    return layer.rsplit(".", 1)[-1]


def startup_kernels(snapshot: dict[str, Any]) -> dict[str, str]:
    """layer -> the kernel it was given at load: its current kernel, or the source of its
    first runtime fallback off that kernel when it has moved since (a fallback of its
    generated rows' kernel leaves the layer on its own kernel: not a move)."""
    out = {layer["layer"]: layer["kernel_id"] for layer in snapshot.get("layers", [])}
    moved: set[str] = set()
    for fb in snapshot.get("runtime_fallbacks", []):
        if fb.get("stage") == GENERATED_ROWS_STAGE:
            continue
        if fb["layer"] in out and fb["layer"] not in moved:
            out[fb["layer"]] = fb["from_kernel"]
            moved.add(fb["layer"])
    return out


def startup_fallback_counts(snapshot: dict[str, Any]) -> Counter[tuple[str, str, str]]:
    """(layer_group, first_choice, startup kernel) -> layers, for layers whose startup
    kernel is not their first choice."""
    started = startup_kernels(snapshot)
    out: Counter[tuple[str, str, str]] = Counter()
    for layer in snapshot.get("layers", []):
        first, got = layer.get("first_choice"), started[layer["layer"]]
        if first and first != got:
            out[(layer_group(layer["layer"]), first, got)] += 1
    return out


def _family(cls: type, name: str, doc: str, labels: list[str],
            counts: Counter) -> Metric:
    fam = cls(P + name, doc, labels=labels)
    for key, n in sorted(counts.items()):
        fam.add_metric(list(key), n)
    return fam


def kernel_families(snapshot: dict[str, Any]) -> Iterator[Metric]:
    """Every kernel metric family of the module docstring, from one snapshot."""
    layers = snapshot.get("layers", [])
    g = GaugeMetricFamily
    yield _family(g, "kernel_selected", "Layers running on each kernel.",
                  ["kernel", "platform", "scale_kind"],
                  Counter((x["kernel_id"], x["platform"], x["scale_kind"]) for x in layers))
    yield _family(g, "kernel_rejections", "Layers for which a kernel was passed over at "
                  "selection.", ["kernel", "reason"],
                  Counter((r["kernel_id"], r["reason"][:_REASON_CHARS]) for x in layers
                          for r in x.get("rejections", [])))
    yield _family(CounterMetricFamily, "kernel_runtime_fallbacks", "Layers moved to "
                  "another kernel after a runtime error.", ["from_kernel", "to_kernel"],
                  Counter((f["from_kernel"], f["to_kernel"])
                          for f in snapshot.get("runtime_fallbacks", [])))
    yield _family(g, "layer_group_kernel", "Layers of each group (qkv_proj, o_proj, "
                  "gate_up_proj, down_proj, lm_head) running on each kernel.",
                  ["layer_group", "kernel"],
                  Counter((layer_group(x["layer"]), x["kernel_id"]) for x in layers))
    yield _family(g, "layer_group_generated_rows_kernel", "Layers of each group whose "
                  "generated rows (decode, drafts) run this kernel, not the group's kernel.",
                  ["layer_group", "kernel"],
                  Counter((layer_group(x["layer"]), x["generated_kernel_id"]) for x in layers
                          if x.get("generated_kernel_id")))
    yield _family(g, "kernel_startup_fallbacks", "Layers that did not get their "
                  "first-choice kernel at load (forced, else the first the host runs).",
                  ["layer_group", "from_kernel", "to_kernel"],
                  startup_fallback_counts(snapshot))
    yield _family(g, "decoder_layers", "Decoder layers on the fused C++ op (path fused) or "
                  "the Python layers (path python, with the reason).", ["path", "reason"],
                  Counter((d["path"], (d["reason"] or "")[:_REASON_CHARS])
                          for d in snapshot.get("decoder_layers", [])))
    attention = snapshot.get("attention")
    yield _family(g, "attention_path", "The model's attention: the C++ paged op (path "
                  "paged) or torch SDPA (path sdpa, not batch-invariant, with the reason).",
                  ["path", "reason"],
                  Counter([(str(attention["path"]),
                            str(attention["reason"] or "")[:_REASON_CHARS])]
                          if attention else []))
    invariant = GaugeMetricFamily(P + "batch_invariant", "1 when every layer's kernel and "
                                  "the attention keep a row's bits whatever the batch.")
    invariant.add_metric([], 1.0 if snapshot.get("batch_invariant", True) else 0.0)
    yield invariant
