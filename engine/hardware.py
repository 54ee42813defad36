"""What this host can run, probed once at startup.

:class:`HardwareInfo` is immutable; tests build fake ones directly (see
``HardwareInfo.fake``) instead of patching the probe.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# cpuid feature names as reported in HardwareInfo.cpu_flags
CPU_FEATURES = (
    "avx2",
    "fma",
    "f16c",
    "avx512f",
    "avx512bw",
    "avx512vl",
    "avx512_vnni",
    "avx512_bf16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
    "amx_fp16",
)
# The extension's dispatch levels, lowest first (ext/csrc/dispatch.cpp).
DISPATCH_LEVELS = ("scalar", "avx2", "avx512", "avx512_vbmi", "amx")


def isa_env_problem(value: str | None) -> str | None:
    """What is wrong with an FP8SERVE_ISA value, None when nothing is (unset or empty: the
    host's level). The extension warns and ignores a name it does not know, so a typo
    (``avx-2``) ran every kernel at the host's level; the probe refuses it instead."""
    if not value or value in DISPATCH_LEVELS:
        return None
    return (f"FP8SERVE_ISA={value!r}: one of {', '.join(DISPATCH_LEVELS)} (unset: this "
            "host's best level)")


@dataclass(frozen=True, slots=True)
class ExtensionStatus:
    """Build/load status of the C++ extension (ext/)."""

    built: bool
    error: str | None = None  # compiler or loader error when not built
    path: str | None = None  # shared library that was loaded
    compiler: str | None = None
    torch_version: str | None = None


@dataclass(frozen=True, slots=True)
class HardwareInfo:
    machine: str  # platform.machine(): x86_64, aarch64, ...
    cpu_model: str
    cpu_flags: frozenset[str]  # subset of CPU_FEATURES present per cpuid
    amx_permitted: bool  # arch_prctl(ARCH_REQ_XCOMP_PERM, XTILEDATA) succeeded
    num_cpus: int
    xpu_available: bool = False
    xpu_name: str | None = None
    cuda_available: bool = False
    cuda_capability: tuple[int, int] | None = None
    cuda_name: str | None = None
    extension: ExtensionStatus = field(default_factory=lambda: ExtensionStatus(built=False))
    # The extension's dispatch level (ext.isa(): the host's best, or lower when
    # FP8SERVE_ISA caps it); None when unknown (no extension, hand-built profiles).
    dispatch_isa: str | None = None

    def has(self, *features: str) -> bool:
        return all(f in self.cpu_flags for f in features)

    @property
    def amx_usable(self) -> bool:
        """AMX counts only when the tile unit exists *and* the OS granted its state."""
        return self.has("amx_tile", "amx_bf16") and self.amx_permitted

    def dispatch_reason(self, level: str) -> str | None:
        """Why the extension will not run ``level`` code (a DISPATCH_LEVELS name) although
        the CPU may: FP8SERVE_ISA lowered the dispatch, or the CPU lacks a feature the level
        needs beyond the flags checked here (amx also needs AVX512_VBMI). None when it will,
        or unknown."""
        isa = self.dispatch_isa
        if isa is None or isa not in DISPATCH_LEVELS:
            return None
        if DISPATCH_LEVELS.index(isa) >= DISPATCH_LEVELS.index(level):
            return None
        return (f"extension dispatch level {isa} is below {level} (FP8SERVE_ISA, or a "
                f"feature {level} needs that this CPU lacks)")

    def feature_map(self) -> dict[str, bool]:
        """Feature name -> available, for /kernels and the hardware_feature metric."""
        out = {f: f in self.cpu_flags for f in CPU_FEATURES}
        out["amx_permitted"] = self.amx_permitted
        out["amx_usable"] = self.amx_usable
        out["xpu"] = self.xpu_available
        out["cuda"] = self.cuda_available
        out["extension_built"] = self.extension.built
        return out

    @classmethod
    def fake(cls, *flags: str, **kw: object) -> HardwareInfo:
        """A hand-built profile for tests, e.g. ``HardwareInfo.fake("avx2", "fma", "f16c")``."""
        defaults: dict[str, object] = dict(
            machine="x86_64", cpu_model="fake", amx_permitted=False, num_cpus=2
        )
        defaults.update(kw)
        return cls(cpu_flags=frozenset(flags), **defaults)  # type: ignore[arg-type]

