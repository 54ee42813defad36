"""fp8serve's C++ extension: build/load once per process, typed wrappers, CPU probe.

    status = ext.load()        # ExtensionStatus; never raises (built=False + error text)
    ops = ext.ops()            # torch.ops.fp8serve (raises if the build failed)
    ext.cpuid_features()       # frozenset of engine.hardware.CPU_FEATURES names
    ext.request_amx_permission()

Tensor layouts (row-major; N = out_features, K = in_features; Np, Kp padded with zeros):

    fp8_to_bf16   fp8[*] e4m3fn -> bf16[*]; exact for all codes but NaN
    pack_vnni32   w[N, K] fp8 -> [Np/32, Kp/2, 32, 2] fp8, Np = ceil32(N), Kp = ceil32(K);
                  element [t, p, j, i] = w[32t + j, 2p + i]
    pack_avx2     w[N, K] fp8 -> [Np/16, K, 16] fp8, Np = ceil16(N); [t, c, j] = w[16t + j, c]
    gemm_avx512   x[M, K] bf16, vnni32 weight, scale f32 [N] (block_k = 0) or
                  [ceil(N/block_n), ceil(K/block_k)], bias f32 [N] | None -> y[M, N] bf16
    gemm_amx      same arguments as gemm_avx512; our AMX tile kernel (TDPBF16PS) for every
                  M, on the real tiles at dispatch level amx, else on the portable
                  stand-in of the tile operations (any host; slow, for tests)
    gemm_avx2     x[M, K] bf16, avx2_16 weight, scale f32 [N] (block_k = 0) or
                  [ceil(N/block_n), ceil(K/block_k)], bias f32 [N] | None -> y[M, N] bf16
    gemm_portable gemm_avx2's arguments on any host (baseline ISA, no intrinsics): one
                  fp32 multiply-then-add chain per output over k, block scales folded per
                  k-block
    pack_bf16_vnni32  w[N, K] bf16 -> [Np/32, Kp/2, 32, 2] bf16, pack_vnni32's element order
    gemm_bf16_avx512  x[M, K] bf16, bf16 vnni32 weight, bias f32 [N] | None -> y[M, N] bf16
                      (fp32 with out_fp32)
    pack_bf16_avx2    w[N, K] bf16 -> [Np/16, K, 16] bf16, pack_avx2's element order
    gemm_bf16_avx2    x[M, K] bf16, bf16 avx2_16 weight, bias f32 [N] | None -> y[M, N] bf16
                      (fp32 with out_fp32)
    gemm_bf16_portable  gemm_bf16_avx2's arguments on any host, the same chains as
                        gemm_portable
    read_xor      buf (any dtype, contiguous, nbytes a positive multiple of 64) -> int64 []:
                  XOR of its 64-bit words, read on all threads (the bandwidth probe)
Every gemm_* op is batch-invariant: row i of y is bitwise the same for any M and any other
rows (ext/csrc/gemm.h, csrc/avx2_gemm.inc, csrc/fp8_gemm_portable.cpp).
"""

from __future__ import annotations

import threading

import torch

from engine.hardware import ExtensionStatus
from ext.build import BuildConfig, build
from ext.cpu import cpuinfo_flags, request_amx_permission

__all__ = [
    "BuildConfig", "load", "ops", "status", "cpuid_features", "request_amx_permission",
    "isa", "fp8_to_bf16", "pack_vnni32", "pack_avx2", "gemm_avx512", "gemm_amx", "gemm_avx2",
    "gemm_portable", "pack_bf16_vnni32", "gemm_bf16_avx512", "pack_bf16_avx2", "gemm_bf16_avx2",
    "gemm_bf16_portable", "read_xor",
]

_lock = threading.Lock()
_status: ExtensionStatus | None = None


def load(config: BuildConfig | None = None) -> ExtensionStatus:
    """Build (if needed) and load the library, once per process. Never raises.

    The first call decides (``config`` or :meth:`BuildConfig.from_env`); later calls
    return the same status: a shared library can be registered only once."""
    global _status
    with _lock:
        if _status is None:
            st = build(config)
            if st.built:
                from ext import fakes

                try:
                    fakes.register()
                except Exception as exc:  # noqa: BLE001 - surfaced as a load failure
                    st = ExtensionStatus(False, f"registering fake impls: {exc}", st.path,
                                         st.compiler, st.torch_version)
            _status = st
        return _status


def status() -> ExtensionStatus | None:
    """The status of the load attempted in this process, or None before any."""
    return _status


def ops():
    """The loaded op namespace ``torch.ops.fp8serve``; RuntimeError if the build failed."""
    st = load()
    if not st.built:
        raise RuntimeError(f"fp8serve C++ extension not built: {st.error}")
    return torch.ops.fp8serve


def cpuid_features() -> frozenset[str]:
    """CPU_FEATURES names usable here (cpuid + OS state); /proc/cpuinfo if not built."""
    if load().built:
        return frozenset(ops().cpu_features())
    return cpuinfo_flags()


def isa() -> str:
    """The ISA level the ops dispatch to: scalar | avx2 | avx512 | amx (FP8SERVE_ISA caps)."""
    return str(ops().isa())


def fp8_to_bf16(fp8: torch.Tensor) -> torch.Tensor:
    """fp8[*] float8_e4m3fn -> bf16[*] (same shape)."""
    return ops().fp8_to_bf16(fp8)


def pack_vnni32(w: torch.Tensor) -> torch.Tensor:
    """w[N, K] fp8 contiguous -> [ceil(N/32), ceil(K/32)*16, 32, 2] fp8."""
    return ops().pack_vnni32(w)


def pack_avx2(w: torch.Tensor) -> torch.Tensor:
    """w[N, K] fp8 contiguous -> [ceil(N/16), K, 16] fp8."""
    return ops().pack_avx2(w)


def gemm_avx512(x: torch.Tensor, w_packed: torch.Tensor, scale: torch.Tensor,
                bias: torch.Tensor | None, n: int, block_n: int = 0, block_k: int = 0,
                gemv_max_m: int = 32) -> torch.Tensor:
    """x[M, K] bf16 @ (vnni32 w * scale).T + bias -> y[M, n] bf16; M <= gemv_max_m: GEMV."""
    return ops().gemm_avx512(x, w_packed, scale, bias, n, block_n, block_k, gemv_max_m)


def gemm_amx(x: torch.Tensor, w_packed: torch.Tensor, scale: torch.Tensor,
             bias: torch.Tensor | None, n: int, block_n: int = 0,
             block_k: int = 0) -> torch.Tensor:
    """As gemm_avx512, through the AMX tile kernel at every M (the stand-in below amx)."""
    return ops().gemm_amx(x, w_packed, scale, bias, n, block_n, block_k)


def gemm_avx2(x: torch.Tensor, w_packed: torch.Tensor, scale: torch.Tensor,
              bias: torch.Tensor | None, n: int, block_n: int = 0,
              block_k: int = 0) -> torch.Tensor:
    """x[M, K] bf16 @ (avx2_16 w * scale).T + bias -> y[M, n] bf16; scale [N], or with
    block_k > 0 [ceil(N/block_n), ceil(K/block_k)] (block_n, block_k multiples of 32)."""
    return ops().gemm_avx2(x, w_packed, scale, bias, n, block_n, block_k)


def gemm_portable(x: torch.Tensor, w_packed: torch.Tensor, scale: torch.Tensor,
                  bias: torch.Tensor | None, n: int, block_n: int = 0,
                  block_k: int = 0) -> torch.Tensor:
    """gemm_avx2's contract on any host: fp32 multiply-then-add chains (block scales folded
    per k-block), baseline ISA."""
    return ops().gemm_portable(x, w_packed, scale, bias, n, block_n, block_k)


def pack_bf16_vnni32(w: torch.Tensor) -> torch.Tensor:
    """w[N, K] bf16 contiguous -> [ceil(N/32), ceil(K/32)*16, 32, 2] bf16."""
    return ops().pack_bf16_vnni32(w)


def pack_bf16_avx2(w: torch.Tensor) -> torch.Tensor:
    """w[N, K] bf16 contiguous -> [ceil(N/16), K, 16] bf16."""
    return ops().pack_bf16_avx2(w)


def gemm_bf16_avx2(x: torch.Tensor, w_packed: torch.Tensor, bias: torch.Tensor | None,
                   n: int, out_fp32: bool = False) -> torch.Tensor:
    """x[M, K] bf16 @ (bf16 avx2_16 w).T + bias -> y[M, n] bf16 (fp32 if out_fp32)."""
    return ops().gemm_bf16_avx2(x, w_packed, bias, n, out_fp32)


def gemm_bf16_portable(x: torch.Tensor, w_packed: torch.Tensor, bias: torch.Tensor | None,
                       n: int, out_fp32: bool = False) -> torch.Tensor:
    """gemm_bf16_avx2's contract on any host (gemm_portable's chains)."""
    return ops().gemm_bf16_portable(x, w_packed, bias, n, out_fp32)


def gemm_bf16_avx512(x: torch.Tensor, w_packed: torch.Tensor, bias: torch.Tensor | None,
                     n: int, out_fp32: bool = False) -> torch.Tensor:
    """x[M, K] bf16 @ (bf16 vnni32 w).T + bias -> y[M, n] bf16 (fp32 if out_fp32)."""
    return ops().gemm_bf16_avx512(x, w_packed, bias, n, out_fp32)


def read_xor(buf: torch.Tensor) -> int:
    """XOR of every 64-bit word of ``buf`` (contiguous CPU, nbytes a positive multiple of
    64), read once on all torch threads; an int64 bit pattern, exact for any thread count."""
    return int(ops().read_xor(buf))
