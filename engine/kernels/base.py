"""The FP8 linear-kernel contract.

Every FP8 linear layer of the model computes ``y = x @ dequant(W).T (+ bias)`` through
one :class:`Fp8Kernel`. The boundary tensors are fixed here and nowhere else:

    weight      [N, K]  torch.float8_e4m3fn, row-major contiguous (the checkpoint and
                        nn.Linear layout: N = out_features, K = in_features)
    scale       float32, the *dequantization multiplier* (``weight_scale_inv`` on disk):
                  ScaleKind.PER_TENSOR   shape []                      W ~= W8 * s
                  ScaleKind.PER_CHANNEL  shape [N]                     W[n] ~= W8[n] * s[n]
                  ScaleKind.BLOCK        shape [ceil(N/bn), ceil(K/bk)] (bn, bk) = block_size
    activation_scale  float32 shape [] or None (static per-tensor activation scale; only
                        W8A8 kernels read it)
    x           [M, K]  torch.bfloat16 (any M >= 0)
    bias        [N]     torch.float32 or None
    y           [M, N]  torch.bfloat16

The loader emits exactly this layout; kernels assert it and never infer orientation from
shape (an [N, K] weight with N == K looks the same as its transpose).

A kernel never mutates the layer: :meth:`Fp8Kernel.prepare` returns a
:class:`PackedWeight` whose ``layout`` tag names the packed format, and
:meth:`Fp8Kernel.apply` consumes only that object.
"""

from __future__ import annotations

import enum
import math
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

import torch

if TYPE_CHECKING:
    from engine.hardware import HardwareInfo

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
DEFAULT_BLOCK = (128, 128)


class ScaleKind(str, enum.Enum):
    PER_TENSOR = "per_tensor"
    PER_CHANNEL = "per_channel"
    BLOCK = "block"


class Platform(str, enum.Enum):
    CPU = "cpu"
    XPU = "xpu"
    CUDA = "cuda"


class LayoutError(ValueError):
    """A tensor crossing the kernel boundary has the wrong shape, dtype or layout."""


def expected_scale_shape(
    kind: ScaleKind, n: int, k: int, block_size: tuple[int, int] = DEFAULT_BLOCK
) -> tuple[int, ...]:
    if kind is ScaleKind.PER_TENSOR:
        return ()
    if kind is ScaleKind.PER_CHANNEL:
        return (n,)
    bn, bk = block_size
    return (math.ceil(n / bn), math.ceil(k / bk))


@dataclass(frozen=True, slots=True)
class Fp8Weight:
    """One FP8 linear layer in the canonical layout (see module docstring)."""

    weight: torch.Tensor  # [N, K] float8_e4m3fn, contiguous
    scale: torch.Tensor  # float32, shape per scale_kind
    scale_kind: ScaleKind
    activation_scale: torch.Tensor | None = None  # float32 [] or None
    block_size: tuple[int, int] = DEFAULT_BLOCK

    @property
    def n(self) -> int:
        return int(self.weight.shape[0])

    @property
    def k(self) -> int:
        return int(self.weight.shape[1])

    def validate(self, name: str = "weight") -> None:
        """Raise :class:`LayoutError` naming ``name`` if any boundary rule is broken."""
        w = self.weight
        if w.dtype != FP8_DTYPE:
            raise LayoutError(f"{name}: weight dtype {w.dtype}, expected {FP8_DTYPE}")
        if w.dim() != 2:
            raise LayoutError(f"{name}: weight shape {tuple(w.shape)}, expected 2-D [N, K]")
        if not w.is_contiguous():
            raise LayoutError(
                f"{name}: weight [N, K] must be row-major contiguous; got strides "
                f"{w.stride()} for shape {tuple(w.shape)} (a transposed [K, N] view?)"
            )
        want = expected_scale_shape(self.scale_kind, self.n, self.k, self.block_size)
        if tuple(self.scale.shape) != want:
            raise LayoutError(
                f"{name}: {self.scale_kind.value} scale shape {tuple(self.scale.shape)}, "
                f"expected {want}"
            )
        if self.scale.dtype != torch.float32:
            raise LayoutError(f"{name}: scale dtype {self.scale.dtype}, expected float32")
        if self.activation_scale is not None and (
            self.activation_scale.dtype != torch.float32 or self.activation_scale.dim() != 0
        ):
            raise LayoutError(f"{name}: activation_scale must be a float32 scalar")


@dataclass(frozen=True, slots=True)
class Fp8Spec:
    """What a kernel needs to know to decide whether it can implement a layer."""

    n: int
    k: int
    scale_kind: ScaleKind
    has_bias: bool = False
    block_size: tuple[int, int] = DEFAULT_BLOCK
    has_activation_scale: bool = False
    weight_contiguous: bool = True

    @classmethod
    def of(cls, w: Fp8Weight, has_bias: bool = False) -> Fp8Spec:
        return cls(
            n=w.n,
            k=w.k,
            scale_kind=w.scale_kind,
            has_bias=has_bias,
            block_size=w.block_size,
            has_activation_scale=w.activation_scale is not None,
            weight_contiguous=w.weight.is_contiguous(),
        )


@dataclass(frozen=True, slots=True)
class PackedWeight:
    """A weight prepared by one kernel. ``layout`` names the packed format exactly
    (e.g. ``"fp8[N,K]"``, ``"vnni_fp8[N/32][K/2][32][2]"``); ``tensors`` holds the
    kernel's own buffers, documented by that kernel."""

    kernel_id: str
    layout: str
    n: int
    k: int
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)
    meta: dict[str, object] = field(default_factory=dict)

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


class Fp8Kernel(ABC):
    """One FP8 linear kernel. Stateless: all per-layer state lives in PackedWeight."""

    id: ClassVar[str]  # stable, operator-facing identifier, e.g. "avx512_w8a16"
    platform: ClassVar[Platform]
    scale_kinds: ClassVar[frozenset[ScaleKind]]
    # True when row i of apply's y is bitwise the same for any M and any other rows of x
    # (what exact greedy serving needs: alone, batched, chunked and speculated agree). The
    # registry never tries a kernel without it ahead of one with it, unless forced.
    batch_invariant: ClassVar[bool] = False
    # The kernel a sequence's generated rows (decode, drafts, recomputed output) run on,
    # over this kernel's packed weight, where the host runs it and no kernel is forced
    # (registry.select_kernel); None: every row on this kernel. Both must be batch-invariant:
    # a row's bits then depend only on its role (prompt or generated) and its own data.
    generated_rows_kernel: ClassVar[str | None] = None

    @abstractmethod
    def is_supported(self, hw: HardwareInfo) -> str | None:
        """None when this host can run the kernel, otherwise the reason it cannot."""

    def can_implement(self, spec: Fp8Spec) -> str | None:
        """None when the kernel can compute this layer, otherwise the reason."""
        if spec.scale_kind not in self.scale_kinds:
            kinds = ", ".join(sorted(k.value for k in self.scale_kinds))
            return f"scale kind {spec.scale_kind.value} not handled (handles {kinds})"
        return None

    @abstractmethod
    def prepare(self, w: Fp8Weight) -> PackedWeight:
        """Pack ``w`` (canonical layout, validated) for :meth:`apply`."""

    @abstractmethod
    def apply(
        self, packed: PackedWeight, x: torch.Tensor, bias: torch.Tensor | None = None
    ) -> torch.Tensor:
        """x [M, K] bf16 (contiguous) -> y [M, N] bf16."""
