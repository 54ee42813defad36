"""JIT build of the C++ extension with torch.utils.cpp_extension + ninja.

The library is built into a cache directory (``FP8SERVE_EXT_DIR``; default
``$FP8SERVE_CACHE_DIR/ext/<torch version>-<source hash>``, the cache root defaulting
to ``~/.cache/fp8serve``) and loaded into the process,
which registers the ``torch.ops.fp8serve`` ops. A failed compile never raises: the
returned :class:`ExtensionStatus` carries the compiler output as ``error``.

Per-ISA code: ``cpp_extension.load`` applies one flag set to every source, so each ISA
translation unit (``fp8_gemm_avx512.cpp``, ``fp8_gemm_avx512_vbmi.cpp``,
``fp8_gemm_avx2.cpp``, ``read_probe_avx512.cpp``, ``read_probe_avx2.cpp``, ...) scopes its
own target with ``#pragma GCC target`` (``ISA_BEGIN`` in ``csrc/isa.h``) and includes no
torch or STL header; everything else is compiled for the baseline ISA. Never ``-march=native``.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import subprocess
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch

from engine.hardware import ExtensionStatus

log = logging.getLogger(__name__)

CSRC = Path(__file__).resolve().parent / "csrc"
LIB_NAME = "fp8serve_ext"
SOURCE_NAMES = (
    "ops.cpp",
    "dispatch.cpp",
    "cpuid.cpp",
    "convert.cpp",
    "pack.cpp",
    "gemm.cpp",
    "fp8_gemm_avx512.cpp",
    "fp8_gemm_avx512_vbmi.cpp",
    "fp8_gemm_avx2.cpp",
    "fp8_gemm_portable.cpp",
    "amx_gemm_tiles.cpp",
    "amx_gemm_standin.cpp",
    "bf16_gemm.cpp",
    "bf16_gemm_avx512.cpp",
    "bf16_gemm_avx2.cpp",
    "attention.cpp",
    "attention_avx512.cpp",
    "attention_avx2.cpp",
    "kv_fp8.cpp",
    "decode_layer.cpp",
    "decode_layer_avx512.cpp",
    "decode_layer_avx2.cpp",
    "decode_team.cpp",
    "decode_team_op.cpp",
    "read_probe.cpp",
    "read_probe_avx2.cpp",
    "read_probe_avx512.cpp",
)
HEADER_NAMES = ("isa.h", "ops.h", "cpuid.h", "avx512_kernels.inc", "gemm.h", "attention.h",
                "decode_layer.h", "decode_team.h", "decode_team_op.h", "avx512_math.inc",
                "avx2_gemm.inc", "avx2_math.inc", "tile_sched.h", "tile_prefetch.inc",
                "amx_gemm.inc", "attention_walk.inc", "fp8_cvt_vbmi.inc",
                "team_profile.h")
BASE_CFLAGS = ("-O3", "-fopenmp", "-fno-math-errno", "-Wall", "-Wno-unused-function", "-Wno-psabi")


def _default_sources() -> tuple[Path, ...]:
    return tuple(CSRC / name for name in SOURCE_NAMES)


@dataclass(frozen=True, slots=True)
class BuildConfig:
    """What to compile and where. ``build_dir=None`` means :func:`default_build_dir`."""

    sources: tuple[Path, ...] = field(default_factory=_default_sources)
    extra_cflags: tuple[str, ...] = ()
    build_dir: Path | None = None
    verbose: bool = False

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> BuildConfig:
        """``FP8SERVE_EXT_DIR`` (build dir), ``FP8SERVE_EXT_CFLAGS`` (extra flags)."""
        env = dict(os.environ) if env is None else env
        build_dir = env.get("FP8SERVE_EXT_DIR") or None
        return cls(
            extra_cflags=tuple(shlex.split(env.get("FP8SERVE_EXT_CFLAGS", ""))),
            build_dir=Path(build_dir).expanduser() if build_dir else None,
        )

    def cflags(self) -> list[str]:
        return [*BASE_CFLAGS, *self.extra_cflags]


def source_hash(cfg: BuildConfig) -> str:
    """Hash of every source and header, the flags, the torch version and the sources'
    folder (12 hex chars): torch's ninja build names the sources by their paths, so two
    checkouts sharing one build folder rebuilt it for each other in turn."""
    h = hashlib.sha256(torch.__version__.encode())
    h.update(str(CSRC.resolve()).encode())
    files = sorted({*cfg.sources, *(CSRC / n for n in HEADER_NAMES)})
    for path in files:
        h.update(path.name.encode())
        h.update(path.read_bytes() if path.exists() else b"<missing>")
    h.update(" ".join(cfg.cflags()).encode())
    return h.hexdigest()[:12]


def cache_root() -> Path:
    """$FP8SERVE_CACHE_DIR, defaulting to $XDG_CACHE_HOME/fp8serve (or ~/.cache/fp8serve):
    where built things are kept (this extension, bench/llamacpp's llama.cpp)."""
    env_root = os.environ.get("FP8SERVE_CACHE_DIR")
    xdg = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache"))
    return Path(env_root) if env_root else xdg / "fp8serve"


def default_build_dir(cfg: BuildConfig) -> Path:
    """cache_root()/ext/<torch>-<hash>."""
    return cache_root() / "ext" / f"{torch.__version__}-{source_hash(cfg)}"


def build_dir_for(cfg: BuildConfig) -> Path:
    return cfg.build_dir if cfg.build_dir is not None else default_build_dir(cfg)


STALE_LOCK_SECONDS = 900  # a cold build takes 1-2 minutes here


def _remove_stale_lock(out_dir: Path) -> None:
    """cpp_extension.load waits forever on the lock file of a build whose process died
    (killed server, OOM). A lock far older than any build is removed, with a warning."""
    lock = out_dir / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if age > STALE_LOCK_SECONDS:
        log.warning("removing stale extension build lock %s (%.0f s old)", lock, age)
        lock.unlink(missing_ok=True)


def compiler_version() -> str | None:
    cxx = os.environ.get("CXX", "c++")
    try:
        out = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    first = out.stdout.splitlines()[:1]
    return first[0].strip() if first else None


@contextmanager
def _one_ninja():
    """PATH with this interpreter's ``ninja`` (the pip package) first while building.

    ninja versions write different ``.ninja_log`` formats, and a build directory that one
    version wrote is rebuilt from scratch by another: a process started with the venv's
    ``bin/`` on PATH and one without would otherwise recompile the shared cache in turn.
    """
    venv_bin = Path(sys.executable).parent
    if not (venv_bin / "ninja").is_file():
        yield
        return
    saved = os.environ.get("PATH", "")
    os.environ["PATH"] = os.pathsep.join([str(venv_bin), saved])
    try:
        yield
    finally:
        os.environ["PATH"] = saved


def build(cfg: BuildConfig | None = None) -> ExtensionStatus:
    """Compile (ninja skips up-to-date objects) and load the library. Never raises."""
    from torch.utils import cpp_extension

    cfg = cfg or BuildConfig.from_env()
    compiler = compiler_version()
    try:
        out_dir = build_dir_for(cfg)
        out_dir.mkdir(parents=True, exist_ok=True)  # load() requires it to exist
        _remove_stale_lock(out_dir)
        with _one_ninja():
            path = cpp_extension.load(
                name=LIB_NAME,
                sources=[str(s) for s in cfg.sources],
                extra_cflags=cfg.cflags(),
                build_directory=str(out_dir),
                is_python_module=False,
                verbose=cfg.verbose,
            )
    except Exception as exc:  # noqa: BLE001 - any build/load failure becomes a status
        return ExtensionStatus(built=False, error=f"{type(exc).__name__}: {exc}",
                               compiler=compiler, torch_version=torch.__version__)
    lib = str(path) if path else str(build_dir_for(cfg) / f"{LIB_NAME}.so")
    return ExtensionStatus(built=True, path=lib, compiler=compiler,
                           torch_version=torch.__version__)
