"""Intel GPU (XPU) FP8 kernels.

xpu_w8a16 (per-tensor, per-channel) and xpu_block_fp8 (block) call a oneDNN FP8 GEMM op;
xpu_torch_w8a16 is the pure-torch fallback on the XPU device (every scale kind).

The op is an injected callable (constructor argument); by default it is looked up in
torch.ops at construction. We call it through these adapter signatures:

    W8A16Op(x [M, K] bf16, weight [N, K] fp8 (row-major), scale fp32 [] | [N],
            bias fp32 [N] | None) -> y [M, N] bf16
    BlockOp(x [M, K] bf16, weight [N, K] fp8 (row-major),
            scale_kn fp32 [k_blocks, n_blocks] *contiguous*, block_size (bn, bk),
            bias fp32 [N] | None) -> y [M, N] bf16

What the default lookup looks for (first found wins; all unverified on real hardware,
this project has no XPU to test on):

    W8A16: torch.ops._xpu_C.fp8_gemm_w8a16(A, B, trans_B, B_scale, bias)
           (vllm-xpu-kernels; called with B = weight [N, K], trans_B = True), then
           torch.ops.torch_ipex.fp8_gemm_w8a16 with the same arguments (IPEX).
    Block: torch.ops._xpu_C.fp8_gemm_w8a16_block / torch.ops.torch_ipex.fp8_gemm_w8a16_block
           (x, weight, trans_B=True, scale_kn, bn, bk, bias) if such an op is registered.

Block-scale layout: the op wants the scale as a contiguous [k_blocks, n_blocks] buffer.
prepare() makes that buffer once (``tensors["scale_kn"]``) and exposes it to every other
consumer as its ``.t()`` view ``tensors["scale"]`` = [n_blocks, k_blocks] (the canonical
block-scale shape, same storage, no copy).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from engine.hardware import HardwareInfo
from engine.kernels.base import Fp8Kernel, Fp8Spec, Fp8Weight, PackedWeight, Platform, ScaleKind
from engine.kernels.torch_kernels import NON_CONTIGUOUS_REASON, DeviceTorchW8A16, check_x

W8A16Op = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, "torch.Tensor | None"],
                   torch.Tensor]
BlockOp = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, tuple[int, int],
                    "torch.Tensor | None"], torch.Tensor]

_OP_NAMESPACES = ("_xpu_C", "torch_ipex")


def _find_op(name: str) -> Any | None:
    for ns in _OP_NAMESPACES:
        try:
            return getattr(getattr(torch.ops, ns), name)
        except (AttributeError, RuntimeError):
            continue
    return None


def default_w8a16_op() -> W8A16Op | None:
    """The registered oneDNN FP8 W8A16 GEMM, adapted to :data:`W8A16Op`, or None."""
    op = _find_op("fp8_gemm_w8a16")
    if op is None:
        return None
    return lambda x, w, s, bias: op(x, w, True, s, bias)


def default_block_op() -> BlockOp | None:
    """The registered oneDNN FP8 block GEMM, adapted to :data:`BlockOp`, or None."""
    op = _find_op("fp8_gemm_w8a16_block")
    if op is None:
        return None
    return lambda x, w, s_kn, blk, bias: op(x, w, True, s_kn, blk[0], blk[1], bias)


def _xpu_reason(hw: HardwareInfo) -> str | None:
    return None if hw.xpu_available else "no XPU device (torch.xpu.is_available() is False)"


class _XpuOpKernel(Fp8Kernel):
    platform = Platform.XPU
    op_name = ""

    def __init__(self, op: Callable[..., torch.Tensor] | None = None,
                 device: str | torch.device | None = None) -> None:
        self.op = op if op is not None else self._default_op()
        self.device = torch.device(device or "xpu")

    def _default_op(self) -> Callable[..., torch.Tensor] | None:
        raise NotImplementedError

    def is_supported(self, hw: HardwareInfo) -> str | None:
        return _xpu_reason(hw) or (self._no_op_reason() if self.op is None else None)

    def _no_op_reason(self) -> str:
        where = " or ".join(f"torch.ops.{ns}.{self.op_name}" for ns in _OP_NAMESPACES)
        return f"no oneDNN FP8 GEMM op registered (looked for {where})"

    def can_implement(self, spec: Fp8Spec) -> str | None:
        if not spec.weight_contiguous:
            return NON_CONTIGUOUS_REASON
        return super().can_implement(spec)

    def _check(self, w: Fp8Weight) -> None:
        w.validate(self.id)
        reason = self.can_implement(Fp8Spec.of(w))
        if reason:
            raise ValueError(f"{self.id}: {reason}")
        if self.op is None:
            raise RuntimeError(f"{self.id}: {self._no_op_reason()}")


class XpuW8A16(_XpuOpKernel):
    """packed: {"weight": fp8 [N, K], "scale": fp32 [] | [N]}, layout "fp8[N,K]"."""

    id = "xpu_w8a16"
    scale_kinds = frozenset({ScaleKind.PER_TENSOR, ScaleKind.PER_CHANNEL})
    op_name = "fp8_gemm_w8a16"

    def _default_op(self) -> W8A16Op | None:
        return default_w8a16_op()

    def prepare(self, w: Fp8Weight) -> PackedWeight:
        self._check(w)
        return PackedWeight(self.id, "fp8[N,K]", w.n, w.k,
                            {"weight": w.weight.to(self.device),
                             "scale": w.scale.to(self.device)})

    def apply(self, packed: PackedWeight, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, K] bf16 -> [M, N] bf16."""
        check_x(x, packed.k, self.id)
        assert self.op is not None
        t = packed.tensors
        return self.op(x, t["weight"], t["scale"], bias)


class XpuBlockFp8(_XpuOpKernel):
    """packed: {"weight": fp8 [N, K],
                "scale_kn": fp32 [k_blocks, n_blocks] contiguous (what the op reads),
                "scale": fp32 [n_blocks, k_blocks] = scale_kn.t() (same storage)},
    layout "fp8[N,K]+scale[kb,nb]"."""

    id = "xpu_block_fp8"
    scale_kinds = frozenset({ScaleKind.BLOCK})
    op_name = "fp8_gemm_w8a16_block"

    def _default_op(self) -> BlockOp | None:
        return default_block_op()

    def prepare(self, w: Fp8Weight) -> PackedWeight:
        self._check(w)
        scale_kn = w.scale.to(self.device).t().contiguous()  # [k_blocks, n_blocks]
        return PackedWeight(self.id, "fp8[N,K]+scale[kb,nb]", w.n, w.k,
                            {"weight": w.weight.to(self.device), "scale_kn": scale_kn,
                             "scale": scale_kn.t()},
                            {"block_size": w.block_size, "scale_kind": w.scale_kind.value})

    def apply(self, packed: PackedWeight, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        """x [M, K] bf16 -> [M, N] bf16."""
        check_x(x, packed.k, self.id)
        assert self.op is not None
        t = packed.tensors
        return self.op(x, t["weight"], t["scale_kn"], packed.meta["block_size"], bias)


class XpuTorchW8A16(DeviceTorchW8A16):
    """Dequantize-and-matmul on the XPU device, every scale kind (see torch_kernels)."""

    id = "xpu_torch_w8a16"
    platform = Platform.XPU
    default_device = "xpu"

    def is_supported(self, hw: HardwareInfo) -> str | None:
        return _xpu_reason(hw)
