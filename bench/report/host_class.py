"""The host class a result set was measured on (AVX2, AVX-512, AMX) and its probe line,
from what bench/run_all.sh recorded: ``host.json`` (`fp8serve kernels --json`, the
hardware probe) or else the ``host`` of ``kernels.json`` (`fp8serve bench kernels`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HOST_CLASSES = ("AVX2", "AVX-512", "AMX")
# the extension's dispatch level (engine.hardware.DISPATCH_LEVELS) -> host class
DISPATCH_CLASS = {"avx2": "AVX2", "avx512": "AVX-512", "avx512_vbmi": "AVX-512", "amx": "AMX"}
AVX512_KERNELS = ("avx512f", "avx512bw", "avx512vl", "avx512_bf16")  # avx512_w8a16's needs


def class_of(features: dict[str, bool], dispatch_isa: str | None = None) -> str:
    """The class whose kernels ran: the extension's dispatch level when recorded (it is
    the host's best unless FP8SERVE_ISA lowered it), else the CPU features."""
    if dispatch_isa in DISPATCH_CLASS:
        return DISPATCH_CLASS[dispatch_isa]
    if features.get("amx_usable"):
        return "AMX"
    if all(features.get(f) for f in AVX512_KERNELS):
        return "AVX-512"
    if all(features.get(f) for f in ("avx2", "fma", "f16c")):
        return "AVX2"
    on = " ".join(f for f, v in features.items() if v) or "none"
    raise ValueError(f"the recorded probe has no AVX2/FMA/F16C (features on: {on}): no host "
                     "class of docs/performance.md")


def recorded_host(results: Path) -> dict[str, Any]:
    """{"machine", "cpu_model", "num_cpus", "features", "dispatch_isa" (or None)} of the
    results in ``results``; ValueError when neither host.json nor kernels.json is there."""
    probe = results / "host.json"
    if probe.is_file():
        hw = json.loads(probe.read_text())["hardware"]
        return {k: hw.get(k) for k in ("machine", "cpu_model", "num_cpus", "features",
                                       "dispatch_isa")}
    kernels = results / "kernels.json"
    if kernels.is_file():
        host = json.loads(kernels.read_text())["host"]
        return {"machine": host.get("machine"), "cpu_model": host.get("cpu_model"),
                "num_cpus": host.get("num_cpus"), "features": host["features"],
                "dispatch_isa": None}
    raise ValueError(f"{results}: no host.json (`fp8serve kernels --json`) or kernels.json: "
                     "the host class is unknown")


def probe_line(host: dict[str, Any]) -> str:
    """One line in the words of `fp8serve kernels`: host, CPUs, features on, dispatch."""
    on = " ".join(f for f, v in host["features"].items() if v) or "-"
    isa = host.get("dispatch_isa") or "not recorded"
    return (f"host: {host['machine']} {host['cpu_model']} ({host['num_cpus']} cpus); "
            f"features on: {on}; extension dispatch: {isa}")
