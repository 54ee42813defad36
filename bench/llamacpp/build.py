"""Build llama.cpp for this host once (see the package docstring): the sdist of the
llama-cpp-python version installed here (else the Makefile's pin), its vendor/llama.cpp
configured with :func:`cmake_args` and built into
``$FP8SERVE_CACHE_DIR/llama.cpp/<version>-<host key>/``. The host key covers the CPU
model and flags, so a cache moved to another CPU never runs code compiled for this one.

Layout of a finished build (``NativeBuild``): ``build/bin/llama-server`` and, beside it,
``libllama.so`` and the ggml libraries (shared, found through an ``$ORIGIN`` RPATH, since
the tree is built under a temporary name and renamed when complete);
``build.log`` holds the compiler output, ``.complete`` the CMake arguments."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from bench.common.errors import BenchError
from engine.hardware import HardwareInfo

PACKAGE = "llama-cpp-python"
PINNED = "0.3.36"  # the Makefile's llamacpp-ref pin, when no llama-cpp-python is installed
MARKER = ".complete"
TARGET = "llama-server"  # and with it libllama, the ggml libraries and libmtmd
# which library bench generate's llama.cpp baseline loads (bench/generate/baselines.py)
LIBRARY_CHOICES = ("auto", "native", "installed")
Log = Callable[[str], object]

COMMON = ("-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=ON",
          "-DCMAKE_BUILD_RPATH_USE_ORIGIN=ON",  # RPATH $ORIGIN: the tree is renamed when done
          "-DLLAMA_BUILD_SERVER=ON", "-DLLAMA_BUILD_TOOLS=ON", "-DLLAMA_BUILD_TESTS=OFF",
          "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
          "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF")

# ggml's ISA options, each with the probe features it needs (engine/hardware.py names);
# used instead of -march=native where native code would fault (see cmake_args)
GGML_ISA = (("GGML_AVX", ("avx2",)), ("GGML_AVX2", ("avx2",)), ("GGML_FMA", ("fma",)),
            ("GGML_F16C", ("f16c",)), ("GGML_AVX512", ("avx512f", "avx512bw", "avx512vl")),
            ("GGML_AVX512_VNNI", ("avx512f", "avx512_vnni")),
            ("GGML_AVX512_BF16", ("avx512f", "avx512_bf16")))


def cmake_args(hw: HardwareInfo) -> tuple[list[str], str]:
    """(CMake arguments for this host, how its ISA was chosen, in words).

    ``-march=native`` (llama.cpp's default), except on a CPU that reports AMX while the OS
    refused the tile state (``hw.amx_permitted`` False): there llama.cpp's AMX code dies
    with SIGILL at its first tile instruction, so the ISA options are spelled out from the
    probe, without AMX."""
    if hw.has("amx_tile") and not hw.amx_permitted:
        isa = [f"-D{opt}={'ON' if hw.has(*need) else 'OFF'}" for opt, need in GGML_ISA]
        return ([*COMMON, "-DGGML_NATIVE=OFF", *isa],
                "the probe's ISA without AMX (the CPU reports AMX, the OS did not grant "
                "the tile state)")
    return [*COMMON, "-DGGML_NATIVE=ON"], "-march=native"


def installed_version() -> str:
    """The installed llama-cpp-python's version (the build must match its bindings),
    else the pin."""
    try:
        return metadata.version(PACKAGE)
    except metadata.PackageNotFoundError:
        return PINNED


def cache_root() -> Path:
    """llama.cpp/ under the extension's cache root (ext/build.py; imported here, not at
    the top, since it brings torch)."""
    from ext.build import cache_root as fp8serve_cache

    return fp8serve_cache() / "llama.cpp"


def host_key(version: str, hw: HardwareInfo, args: list[str]) -> str:
    """<version>-<12 hex>: the hash of the CPU model, its flags, the AMX grant and the
    CMake arguments."""
    h = hashlib.sha256(" ".join([hw.cpu_model, *sorted(hw.cpu_flags),
                                 str(hw.amx_permitted), *args]).encode())
    return f"{version}-{h.hexdigest()[:12]}"


@dataclass(frozen=True)
class NativeBuild:
    root: Path
    version: str
    how: str  # cmake_args' words

    @property
    def bin_dir(self) -> Path:
        return self.root / "build" / "bin"

    @property
    def server(self) -> Path:
        return self.bin_dir / TARGET

    @property
    def lib_dir(self) -> Path:
        """Where libllama.so is: llama-cpp-python's ``LLAMA_CPP_LIB_PATH``."""
        return self.bin_dir

    def is_complete(self) -> bool:
        return (self.root / MARKER).is_file() and self.server.is_file() and \
            (self.lib_dir / "libllama.so").is_file()


def planned(hw: HardwareInfo, version: str | None = None) -> tuple[NativeBuild, list[str]]:
    """(the build this host uses, whether made yet or not; its CMake arguments)."""
    version = version or installed_version()
    args, how = cmake_args(hw)
    return NativeBuild(cache_root() / host_key(version, hw, args), version, how), args


def ensure_native(hw: HardwareInfo, log: Log = print) -> NativeBuild:
    """This host's build, made first if missing (the sdist download and a compile of
    10-30 minutes on 2 cores). Raises BenchError naming the log when a step fails."""
    build, args = planned(hw)
    if build.is_complete():
        return build
    if shutil.which("cmake") is None:
        raise BenchError("building llama.cpp needs cmake (apt-get install cmake)")
    part = build.root.with_name(build.root.name + f".partial-{os.getpid()}")
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    t0 = time.monotonic()
    log(f"llama.cpp {build.version}: building for this host ({build.how}) in {build.root}")
    src = fetch_source(build.version, part, log)
    compile_tree(src, part / "build", args, part / "build.log", log)
    shutil.rmtree(part / "src")  # the unpacked sdist; the build tree stays
    (part / MARKER).write_text(" ".join(args) + "\n")
    shutil.rmtree(build.root, ignore_errors=True)
    part.rename(build.root)
    log(f"llama.cpp {build.version}: built in {time.monotonic() - t0:.0f} s")
    return build


def fetch_source(version: str, dest: Path, log: Log) -> Path:
    """vendor/llama.cpp of the llama-cpp-python ``version`` sdist, unpacked under
    ``dest``/src (pip download: the configured index, no wheel)."""
    log(f"downloading the {PACKAGE}=={version} sdist")
    with tempfile.TemporaryDirectory() as tmp:
        run([sys.executable, "-m", "pip", "download", f"{PACKAGE}=={version}",
             "--no-binary", ":all:", "--no-deps", "--quiet", "-d", tmp],
            dest / "download.log", f"pip download {PACKAGE}=={version}")
        sdists = sorted(Path(tmp).glob("*.tar.gz"))
        if not sdists:
            raise BenchError(f"pip download {PACKAGE}=={version} gave no sdist")
        with tarfile.open(sdists[0]) as tar:
            members = [m for m in tar.getmembers() if "/vendor/llama.cpp/" in m.name]
            tar.extractall(dest / "src", members=members, filter="data")
    found = sorted((dest / "src").glob("*/vendor/llama.cpp/CMakeLists.txt"))
    if not found:
        raise BenchError(f"the {PACKAGE}=={version} sdist has no vendor/llama.cpp")
    return found[0].parent


def compile_tree(src: Path, out: Path, args: list[str], log_path: Path, log: Log) -> None:
    gen = ["-G", "Ninja"] if shutil.which("ninja") else []
    run(["cmake", "-S", str(src), "-B", str(out), *gen, *args], log_path, "cmake configure")
    log(f"compiling {TARGET} (log: {log_path})")
    run(["cmake", "--build", str(out), "--target", TARGET, "-j", str(os.cpu_count() or 1)],
        log_path, "cmake --build")


INFO_SCRIPT = ("import ctypes, sys; f = ctypes.CDLL(sys.argv[1]).llama_print_system_info; "
               "f.restype = ctypes.c_char_p; print(f().decode())")


def system_info(lib_dir: Path) -> str:
    """What ``libllama.so`` in ``lib_dir`` reports as its CPU features
    (``llama_print_system_info``: "CPU : SSE3 = 1 | AVX2 = 1 | ..."), loaded in a child
    process so that this one keeps whatever llama.cpp it has."""
    out = subprocess.run([sys.executable, "-c", INFO_SCRIPT, str(lib_dir / "libllama.so")],
                         capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise BenchError(f"{lib_dir / 'libllama.so'} does not load: {out.stderr.strip()}")
    return out.stdout.strip().rstrip(" |")


def run(cmd: list[str], log_path: Path, what: str) -> None:
    with log_path.open("a") as out:
        out.write("$ " + " ".join(cmd) + "\n")
        out.flush()
        rc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, check=False).returncode
    if rc != 0:
        tail = log_path.read_text(errors="replace")[-1500:]
        raise BenchError(f"{what} failed (exit {rc}); log {log_path}:\n{tail}")
