"""`fp8serve bench llamacpp [--json]`: build llama.cpp for this host once (build.py; a
no-op when built) and print where it is, how its ISA was chosen and which SIMD levels the
library reports (``llama_print_system_info``)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from bench.common.errors import BenchError

INFO_SCRIPT = ("import ctypes, sys; f = ctypes.CDLL(sys.argv[1]).llama_print_system_info; "
               "f.restype = ctypes.c_char_p; print(f().decode())")


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("llamacpp", help="build llama.cpp for this host (the baselines' "
                                         "llama-server and library) and show what it runs")
    p.add_argument("--json", type=Path, default=None, help="also write the report here")
    p.set_defaults(func=run)


def library_system_info(lib_dir: Path) -> str:
    """What ``libllama.so`` in ``lib_dir`` reports as its CPU features (loaded in a child
    process, so this one keeps whatever llama.cpp it has)."""
    out = subprocess.run([sys.executable, "-c", INFO_SCRIPT, str(lib_dir / "libllama.so")],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise BenchError(f"{lib_dir / 'libllama.so'} does not load: {out.stderr.strip()}")
    return out.stdout.strip().rstrip(" |")


def run(args: argparse.Namespace) -> int:
    from bench.llamacpp.build import ensure_native
    from engine.hardware import probe_hardware

    build = ensure_native(probe_hardware())
    report = {"version": build.version, "root": str(build.root), "built": build.how,
              "server": str(build.server), "lib_dir": str(build.lib_dir),
              "system_info": library_system_info(build.lib_dir)}
    for key, value in report.items():
        print(f"{key}: {value}")
    if args.json is not None:
        args.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0
