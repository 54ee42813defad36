"""AMX FP8 W8A16 kernels: our own tile microkernel (ext/csrc/amx_gemm.inc) for every M.

amx_w8a16 (per-tensor, per-channel) / amx_block_w8a16 (block scales)
    packed: {"weight": fp8 [ceil(N/32), ceil(K/32)*16, 32, 2] (VNNI32_LAYOUT, as avx512),
             "scale":  fp32 [N] (per-tensor broadcast at prepare time) or
                       fp32 [ceil(N/bn), ceil(K/bk)] (block)}
    apply:  x[M, K] bf16 -> y[M, N] bf16, batch-invariant: row i is bitwise the same for
            any M and any other rows. Every output runs TDPBF16PS over the 32-deep steps
            of K in increasing k from zero, its FP8 weight unpacked to exact BF16 values;
            the scale is applied on the fp32 sums (per k-block with block scales). Two
            walks run these same chains: M > 16, per 32-column weight tile, K in chunks
            (256 deep, or one k-block) unpacked once into an L1-resident buffer, then
            every 16-row tile of x (the last one zero padded); M <= 16 (decode), the
            tiles configured with M rows, each weight tile streamed through a ring of
            unpacked steps, step s + 1 unpacked before step s's tile work, the sums held
            in the tiles across K. Not bitwise equal to avx512_w8a16 (the tile
            instruction's internal order is its own).
Rows by role (--rows-by-role on, or auto with max_num_seqs 1 and no speculative
decoding; engine/config.py ROWS_BY_ROLE): a sequence's prompt rows run the tiles; its
generated rows (decode, draft verification, output recomputed after a preemption) run
avx512_w8a16 / avx512_block_w8a16 on the same packed weight (both read VNNI32_LAYOUT),
where the host runs it, it is not disabled and no kernel is forced (generated_rows_kernel,
registry.generated_kernel). One decode row streams the weight from memory, where the
AVX-512 GEMV reads faster than the tiles; prefill is compute-bound, where the tiles win.
Both kernels are batch-invariant, so a row's bits depend on its role and its own data only:
alone, batched, chunked and speculated runs agree. A block of K/V computed in one role
must not be read in the other: the prefix cache then keys each block by its positions'
roles too (engine/kv/prefix_cache.py by_role).
From two rows on the tiles decode faster (the AVX-512 GEMV is compute-bound there), so
an engine that batches sequences or verifies drafts runs every row on the tiles by
default, as --rows-by-role off and
FP8SERVE_DISABLED_KERNELS=avx512_w8a16,avx512_block_w8a16 do.
Gate: AMX tile + bf16 granted by the OS (hw.amx_usable), AVX-512 BF16, extension built,
dispatch level amx (the extension's: those plus AVX512_VBMI, whose table unpacks the FP8
weight; FP8SERVE_ISA may lower it). Below that level the op runs the same walk
on a portable stand-in of the tile operations (tests on every host; never served).
"""

from __future__ import annotations

import torch

import ext
from engine.hardware import HardwareInfo
from engine.kernels.avx512 import _Vnni32Kernel
from engine.kernels.base import PackedWeight, ScaleKind


class _AmxKernel(_Vnni32Kernel):
    def is_supported(self, hw: HardwareInfo) -> str | None:
        if not hw.amx_usable:
            if hw.has("amx_tile", "amx_bf16"):
                return "AMX present but the OS did not grant tile state (arch_prctl)"
            return "CPU lacks AMX tile/bf16"
        return super().is_supported(hw) or hw.dispatch_reason("amx")

    def _gemm(self, x: torch.Tensor, packed: PackedWeight,
              bias: torch.Tensor | None) -> torch.Tensor:
        bn, bk = packed.meta["block"]  # type: ignore[misc]
        t = packed.tensors
        return ext.gemm_amx(x, t["weight"], t["scale"], bias, packed.n, bn, bk)


class AmxW8A16(_AmxKernel):
    id = "amx_w8a16"
    scale_kinds = frozenset({ScaleKind.PER_TENSOR, ScaleKind.PER_CHANNEL})
    generated_rows_kernel = "avx512_w8a16"


class AmxBlockW8A16(_AmxKernel):
    id = "amx_block_w8a16"
    scale_kinds = frozenset({ScaleKind.BLOCK})
    generated_rows_kernel = "avx512_block_w8a16"
