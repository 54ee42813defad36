"""`fp8serve build-ext`: compile the C++ extension ahead of time into its cache dir."""

from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("build-ext", help="compile the C++ FP8 kernel extension (ext/)")
    p.add_argument("--build-dir", type=Path, default=None,
                   help="output directory (default: $FP8SERVE_EXT_DIR, else "
                        "$FP8SERVE_CACHE_DIR/ext/<torch>-<source hash>; $FP8SERVE_CACHE_DIR "
                        "defaults to ~/.cache/fp8serve, or $XDG_CACHE_HOME/fp8serve)")
    p.add_argument("--verbose", action="store_true", help="show the compiler commands")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    import ext
    from cli.main import CliError
    from ext.build import BuildConfig

    cfg = BuildConfig.from_env()
    if args.build_dir is not None:
        cfg = replace(cfg, build_dir=args.build_dir.expanduser())
    cfg = replace(cfg, verbose=args.verbose)
    st = ext.load(cfg)
    if not st.built:
        tail = (st.error or "unknown error").strip().splitlines()[-20:]
        raise CliError("extension build failed:\n" + "\n".join(tail))
    print(f"built {st.path}")
    print(f"compiler: {st.compiler}; torch {st.torch_version}; dispatch ISA: {ext.isa()}")
    print(f"cpu features: {' '.join(sorted(ext.cpuid_features()))}")
    return 0
