"""The BF16-weight linear kernels (the lm_head, unquantized decoder linears), in priority
order.

bf16_avx512 (ext/csrc/bf16_gemm_avx512.cpp)
    packed: {"weight": bf16 [ceil(N/32), ceil(K/32)*16, 32, 2]  (BF16_VNNI32_LAYOUT:
                       element [t, p, j, i] = w[32t + j, 2p + i], zero padded)}
    apply:  x[M, K] bf16 -> y[M, N] bf16, or fp32 straight from the fp32 accumulators.
            Batch-invariant: row i of y is bitwise the same for any M and any other rows
            (one dpbf16 chain per output over K in order; work split over N only).
    Gate: avx512f/bw/vl + avx512_bf16, the extension built with the op, and an AVX-512
    dispatch level (FP8SERVE_ISA may lower it).

bf16_avx2 (ext/csrc/bf16_gemm_avx2.cpp, the column tiles of csrc/avx2_gemm.inc)
    packed: {"weight": bf16 [ceil(N/16), K, 16]  (BF16_AVX2_LAYOUT: element [t, c, j] =
                       w[16t + j, c], zero padded)}
    apply:  as bf16_avx512; bf16 -> fp32 exactly (a shift), fp32 FMA in two accumulator
            sets per output whose order depends on K alone, so row i of y is bitwise the
            same for any M. Widening is shared by up to 48 rows (verify chunks, prefill).
    Gate: avx2, fma, f16c, the extension built with the op, dispatch level >= avx2.

bf16_portable (ext/csrc/fp8_gemm_portable.cpp)
    packed: as bf16_avx2 (BF16_AVX2_LAYOUT).
    apply:  as bf16_avx2, through gemm_bf16_portable: baseline ISA (no intrinsics), one
            fp32 multiply-then-add chain per output over K in order, so row i of y is
            bitwise the same for any M. For hosts below AVX2 (or FP8SERVE_ISA=scalar).
    Gate: the extension built with the op.

Operators force or disable these as they do the FP8 kernels (engine/kernels/registry/overrides.py
KernelOverrides: ``--kernel bf16_avx2``, ``--disable-kernel bf16_avx512``); torch_mm, the
last resort, can be forced (a fallback warning names it) or disabled (then a host that
runs none of the others fails at startup).

Without the extension callers use torch.mm, whose row i may depend on M (oneDNN picks its
blocking by shape) and which emulates bf16 on CPUs without AVX-512 BF16, one weight pass
per row.

Memory: the packed copy is one more N x K bf16 tensor (plus padding to multiples of 32).
For a tied lm_head the embedding table stays for F.embedding, so the model holds the
V x H table twice: the embedding and the packed head.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

import ext
from engine.hardware import DISPATCH_LEVELS, HardwareInfo
from engine.kernels.avx2 import AVX2_FLAGS
from engine.kernels.avx512 import AVX512_FLAGS, extension_reason, missing_flags
from engine.kernels.base import LayoutError, PackedWeight
from engine.kernels.registry import (
    BF16_KERNEL_IDS,
    DISABLED_REASON,
    NO_OVERRIDES,
    KernelOverrides,
    NoKernelError,
)

KERNEL_ID, AVX2_KERNEL_ID, PORTABLE_KERNEL_ID, TORCH_KERNEL_ID = BF16_KERNEL_IDS
# the scale_kind a bf16 linear's choice carries in the kernel report (metrics' label)
BF16_SCALE_KIND = "bf16"
BF16_VNNI32_LAYOUT = "bf16_vnni32[ceil(N/32)][ceil(K/32)*16][32][2]"
BF16_AVX2_LAYOUT = "bf16_avx2_16[ceil(N/16)][K][16]"
_LAYOUTS = {KERNEL_ID: BF16_VNNI32_LAYOUT, AVX2_KERNEL_ID: BF16_AVX2_LAYOUT,
            PORTABLE_KERNEL_ID: BF16_AVX2_LAYOUT}


def _dispatch_below(level: str) -> str | None:
    """Why the loaded extension will not run ``level`` code (FP8SERVE_ISA lowered it), read
    from the extension itself: a hand-built profile need not carry the level."""
    isa = ext.isa()
    if DISPATCH_LEVELS.index(isa) < DISPATCH_LEVELS.index(level):
        return f"dispatch ISA {isa} is below {level} (FP8SERVE_ISA)"
    return None


def bf16_gemm_reason(hw: HardwareInfo) -> str | None:
    """None when bf16_avx512 can run on this host, else why not."""
    if reason := missing_flags(hw, AVX512_FLAGS) or extension_reason(hw):
        return reason
    if not hasattr(ext.ops(), "gemm_bf16_avx512"):
        return "C++ extension build lacks gemm_bf16_avx512"
    return _dispatch_below("avx512")


def bf16_avx2_reason(hw: HardwareInfo) -> str | None:
    """None when bf16_avx2 can run on this host, else why not."""
    if reason := (missing_flags(hw, AVX2_FLAGS) or extension_reason(hw)
                  or hw.dispatch_reason("avx2")):
        return reason
    if not hasattr(ext.ops(), "gemm_bf16_avx2"):
        return "C++ extension build lacks gemm_bf16_avx2"
    return _dispatch_below("avx2")


def bf16_portable_reason(hw: HardwareInfo) -> str | None:
    """None when bf16_portable can run on this host, else why not."""
    if reason := extension_reason(hw):
        return reason
    if not hasattr(ext.ops(), "gemm_bf16_portable"):
        return "C++ extension build lacks gemm_bf16_portable"
    return None


# the C++ bf16 kernels in priority order (all batch-invariant); torch.mm after them is not
BF16_KERNELS = (KERNEL_ID, AVX2_KERNEL_ID, PORTABLE_KERNEL_ID)
FORCED_TORCH_REASON = "forced by operator (FP8SERVE_KERNEL / --kernel torch_mm)"


def bf16_table(hw: HardwareInfo, overrides: KernelOverrides = NO_OVERRIDES
               ) -> list[tuple[str, str | None]]:
    """[(kernel id, None if this host runs it and the operator left it enabled, else why
    not)] in priority order, torch_mm (runnable everywhere) last: the `cpu/bf16` table of
    the kernel report."""
    reasons = {KERNEL_ID: bf16_gemm_reason, AVX2_KERNEL_ID: bf16_avx2_reason,
               PORTABLE_KERNEL_ID: bf16_portable_reason, TORCH_KERNEL_ID: lambda hw: None}
    return [(k, DISABLED_REASON if k in overrides.disabled else reasons[k](hw))
            for k in BF16_KERNEL_IDS]


@dataclass(frozen=True, slots=True)
class Bf16Choice:
    """A bf16 linear's kernel: ``passed`` the kernels tried before it and why not;
    ``warning`` when a forced kernel could not run; ``first`` the forced kernel, else the
    table's first the host runs (registry.first_choice: a choice other than it is a
    startup fallback)."""

    kernel_id: str
    passed: tuple[tuple[str, str], ...]
    warning: str | None
    first: str

    @property
    def reason(self) -> str | None:
        """None for a C++ kernel; for torch_mm, why it runs (forced, or why none of the
        C++ kernels runs)."""
        if self.kernel_id != TORCH_KERNEL_ID:
            return None
        if not self.passed:  # tried first: forced
            return FORCED_TORCH_REASON
        return "; ".join(f"{k}: {why}" for k, why in self.passed)


def bf16_choice(hw: HardwareInfo, overrides: KernelOverrides = NO_OVERRIDES
                ) -> Bf16Choice:
    """The kernel a bf16 linear runs on this host: the forced one (overrides.forced_bf16)
    where it runs, else the first of the table the host runs and the operator left
    enabled. Raises NoKernelError (every reason) when there is none."""
    table = bf16_table(hw, overrides)
    forced = overrides.forced_bf16
    first = forced or next((k for k, why in table if why is None), TORCH_KERNEL_ID)
    order = ([(k, w) for k, w in table if k == forced]
             + [(k, w) for k, w in table if k != forced])
    passed: list[tuple[str, str]] = []
    for kernel_id, why in order:
        if why is None:
            warning = None if forced in (None, kernel_id) else (
                f"forced kernel {forced} cannot run ({dict(table)[forced]}); using {kernel_id}")
            return Bf16Choice(kernel_id, tuple(passed), warning, first)
        passed.append((kernel_id, why))
    raise NoKernelError("no bf16 kernel: " + "; ".join(f"{k}: {why}" for k, why in passed))


def choose_bf16_kernel(hw: HardwareInfo, overrides: KernelOverrides = NO_OVERRIDES
                       ) -> tuple[str, str | None]:
    """(kernel id, None) for the C++ kernel a bf16 linear runs, else ("torch_mm", why)."""
    choice = bf16_choice(hw, overrides)
    return choice.kernel_id, choice.reason


@dataclass(frozen=True, slots=True)
class Bf16Gemm:
    """One BF16 weight packed for bf16_avx512, bf16_avx2 or bf16_portable. Stateless apart
    from the packed tensor."""

    packed: PackedWeight

    @property
    def kernel_id(self) -> str:
        return self.packed.kernel_id

    @classmethod
    def prepare(cls, weight: torch.Tensor, kernel_id: str = KERNEL_ID) -> Bf16Gemm:
        """weight [N, K] bf16, row-major contiguous (never a transposed view)."""
        if kernel_id not in _LAYOUTS:
            raise ValueError(f"unknown bf16 kernel {kernel_id!r}; one of {sorted(_LAYOUTS)}")
        if weight.dim() != 2 or weight.dtype != torch.bfloat16:
            raise LayoutError(f"{kernel_id}: weight must be [N, K] bf16, got "
                              f"{tuple(weight.shape)} {weight.dtype}")
        if not weight.is_contiguous():
            raise LayoutError(f"{kernel_id}: weight [N, K] must be row-major contiguous; got "
                              f"strides {weight.stride()} (a transposed [K, N] view?)")
        n, k = int(weight.shape[0]), int(weight.shape[1])
        pack = ext.pack_bf16_vnni32 if kernel_id == KERNEL_ID else ext.pack_bf16_avx2
        packed = PackedWeight(kernel_id, _LAYOUTS[kernel_id], n, k, {"weight": pack(weight)})
        return cls(packed)

    def __call__(self, x: torch.Tensor, bias: torch.Tensor | None = None,
                 out_fp32: bool = False) -> torch.Tensor:
        """x [M, K] bf16, bias fp32 [N] | None -> y [M, N] bf16 (fp32 with out_fp32)."""
        p = self.packed
        if x.dim() != 2 or x.shape[1] != p.k or x.dtype != torch.bfloat16:
            raise LayoutError(f"{p.kernel_id}: x must be [M, K={p.k}] bf16, got "
                              f"{tuple(x.shape)} {x.dtype}")
        gemm = {KERNEL_ID: ext.gemm_bf16_avx512, AVX2_KERNEL_ID: ext.gemm_bf16_avx2,
                PORTABLE_KERNEL_ID: ext.gemm_bf16_portable}[p.kernel_id]
        return gemm(x, p.tensors["weight"], bias, p.n, out_fp32)
