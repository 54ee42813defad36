"""`fp8serve bench llamacpp [--json]`: build llama.cpp for this host once (build.py; a
no-op when built) and print where it is, how its ISA was chosen and which SIMD levels the
library reports (``llama_print_system_info``)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("llamacpp", help="build llama.cpp for this host (the baselines' "
                                         "llama-server and library) and show what it runs")
    p.add_argument("--json", type=Path, default=None, help="also write the report here")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from bench.llamacpp.build import ensure_native, system_info
    from engine.hardware_probe import probe_hardware

    build = ensure_native(probe_hardware())
    report = {"version": build.version, "root": str(build.root), "built": build.how,
              "server": str(build.server), "lib_dir": str(build.lib_dir),
              "system_info": system_info(build.lib_dir)}
    for key, value in report.items():
        print(f"{key}: {value}")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0
