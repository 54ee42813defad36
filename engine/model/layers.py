"""Building blocks of the decoder: RMSNorm, rotary tables (plain RoPE, YaRN, Llama-4 query
scaling) and the linear modules (FP8 through a LayerKernel, or plain bf16), including the
row-wise fusion of q/k/v and gate/up.

Tensor boundaries (T = tokens in the step, H = hidden size, D = head_dim):
    rms_norm       x [T, H] bf16, weight [H] bf16               -> [T, H] bf16
    RopeTables     cos/sin [P, D/2] fp32 for k; q_cos/q_sin [P, D/2] fp32 for q (the
                   Llama-4 query scale folded in); P = max positions
    StepRope       cos2/sin2 [T, Hq + Hkv, 2, D/2] fp32, selected once per step
    apply_rope     qk [T, Hq + Hkv, D] bf16 -> [T, Hq + Hkv, D] bf16
    Linear         x [M, K] bf16 -> y [M, N] bf16
"""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from engine.config import RopeConfig
from engine.hardware import HardwareInfo
from engine.kernels.base import Fp8Weight, Platform, ScaleKind
from engine.kernels.bf16_linear import (
    BF16_SCALE_KIND,
    TORCH_KERNEL_ID,
    Bf16Choice,
    Bf16Gemm,
    bf16_choice,
)
from engine.kernels.layer_kernel import KernelReport, LayerChoice, LayerKernel
from engine.kernels.registry import NO_OVERRIDES, KernelOverrides, Rejection
from engine.memory import WeightSource
from engine.weights import LinearWeight

log = logging.getLogger(__name__)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [T, H] bf16 -> bf16: x * rsqrt(mean(x^2) + eps) in fp32, cast back, times weight."""
    normed = F.rms_norm(x.float(), (x.shape[-1],), None, eps)
    return weight * normed.to(x.dtype)


# --- rotary embedding -------------------------------------------------------------------


def _mscale(scale: float, m: float = 1.0) -> float:
    return 1.0 if scale <= 1 else 0.1 * m * math.log(scale) + 1.0


def rope_inv_freq(rope: RopeConfig, head_dim: int) -> torch.Tensor:
    """inv_freq fp32 [head_dim/2] (plain RoPE, or YaRN's blend of inter/extrapolation)."""
    pos_freq = rope.theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    extra = 1.0 / pos_freq
    if rope.rope_type == "default":
        return extra
    inter = 1.0 / (rope.factor * pos_freq)

    def correction_dim(rotations: float) -> float:
        orig = rope.original_max_position_embeddings
        return (head_dim * math.log(orig / (rotations * 2 * math.pi))) / (2 * math.log(rope.theta))

    low, high = correction_dim(rope.beta_fast), correction_dim(rope.beta_slow)
    if rope.truncate:  # whole dimensions (the default; truncate: false keeps the fractions)
        low, high = math.floor(low), math.ceil(high)
    low, high = float(max(low, 0)), float(min(high, head_dim - 1))
    if low == high:
        high += 0.001  # as in the reference: avoid a zero-width ramp
    ramp = ((torch.arange(head_dim // 2, dtype=torch.float32) - low) / (high - low)).clamp(0, 1)
    extra_weight = 1.0 - ramp
    return inter * (1.0 - extra_weight) + extra * extra_weight


def rope_attention_factor(rope: RopeConfig) -> float:
    """The cos/sin multiplier: 1 for plain RoPE; YaRN: the config's attention_factor, else
    mscale(f, m)/mscale(f, m_all)."""
    if rope.rope_type == "default":
        return 1.0
    if rope.attention_factor is not None:
        return rope.attention_factor
    if rope.mscale and rope.mscale_all_dim:
        return _mscale(rope.factor, rope.mscale) / _mscale(rope.factor, rope.mscale_all_dim)
    return _mscale(rope.factor)


def llama4_query_scale(rope: RopeConfig, positions: torch.Tensor) -> torch.Tensor:
    """positions [P] int -> fp32 [P]: 1 + beta * ln(1 + floor(pos / original_max_pos))."""
    p = positions.to(torch.float32)
    orig = rope.original_max_position_embeddings
    return 1.0 + rope.llama_4_scaling_beta * torch.log1p(torch.floor(p / orig))


@dataclass(frozen=True, slots=True)
class RopeTables:
    """Precomputed rotary tables for positions [0, max_positions), all fp32 [P, D/2].
    q_cos/q_sin carry the Llama-4 query scale (it multiplies q after RoPE, a linear map,
    so it folds into both tables)."""

    cos: torch.Tensor
    sin: torch.Tensor
    q_cos: torch.Tensor
    q_sin: torch.Tensor

    @property
    def max_positions(self) -> int:
        return int(self.cos.shape[0])

    @classmethod
    def build(cls, rope: RopeConfig, head_dim: int, max_positions: int) -> RopeTables:
        pos = torch.arange(max_positions, dtype=torch.int64)
        angles = pos.to(torch.float32)[:, None] * rope_inv_freq(rope, head_dim)[None, :]
        factor = rope_attention_factor(rope)
        cos, sin = angles.cos() * factor, angles.sin() * factor
        if rope.llama_4_scaling_beta == 0:
            return cls(cos, sin, cos, sin)
        qs = llama4_query_scale(rope, pos)[:, None]
        return cls(cos, sin, cos * qs, sin * qs)


@dataclass(frozen=True, slots=True)
class StepRope:
    """This step's rotation factors for q and k together, fp32 [T, Hq + Hkv, 2, D/2]:
    x viewed as [.., 2, D/2] (the two halves) rotates as x * cos2 + x.flip(-2) * sin2 with
    cos2 = (cos, cos) and sin2 = (-sin, sin); the q heads' rows carry the Llama-4 scale.
    Built once per step, shared by every layer."""

    cos2: torch.Tensor
    sin2: torch.Tensor

    @classmethod
    def select(cls, tables: RopeTables, positions: torch.Tensor, num_heads: int,
               num_kv_heads: int) -> StepRope:
        """positions [T] int64 -> the step's factors (raises past the table)."""
        if positions.numel() and int(positions.max()) >= tables.max_positions:
            raise ValueError(f"position {int(positions.max())} beyond the rotary table "
                             f"({tables.max_positions} positions = max_model_len)")
        t = positions.shape[0]

        def heads(c: torch.Tensor, s: torch.Tensor, n: int) -> tuple[torch.Tensor, ...]:
            c, s = c.index_select(0, positions), s.index_select(0, positions)
            c2 = torch.stack((c, c), dim=1)[:, None].expand(t, n, 2, -1)
            s2 = torch.stack((-s, s), dim=1)[:, None].expand(t, n, 2, -1)
            return c2, s2

        qc, qs = heads(tables.q_cos, tables.q_sin, num_heads)
        kc, ks = heads(tables.cos, tables.sin, num_kv_heads)
        return cls(torch.cat((qc, kc), dim=1), torch.cat((qs, ks), dim=1))


def apply_rope(qk: torch.Tensor, rope: StepRope) -> torch.Tensor:
    """Half-split rotation of q and k heads at once, in fp32.
    qk [T, Hq + Hkv, D] bf16 (any strides) -> [T, Hq + Hkv, D] bf16 contiguous."""
    t, h, d = qk.shape
    x = qk.reshape(t, h, 2, d // 2).float()
    out = x * rope.cos2
    out.addcmul_(x.flip(2), rope.sin2)
    return out.view(t, h, d).to(qk.dtype)


# --- linear modules ---------------------------------------------------------------------


class Bf16Linear:
    """y [M, N] bf16 = x [M, K] bf16 @ w.T, w bf16 [N, K] (``weight``, kept as given).

    With ``hw`` able to run bf16_avx512, bf16_avx2 or bf16_portable (the extension built;
    engine/kernels/bf16_linear.py) the product is the batch-invariant C++ GEMM on a packed
    copy of w, made on the first call (a caller that replaces this module before running it
    never pays for the copy); else torch.mm, whose row i may depend on M. ``kernel_id`` /
    ``reason`` say which and why."""

    def __init__(self, name: str, weight: torch.Tensor, hw: HardwareInfo | None = None,
                 overrides: KernelOverrides = NO_OVERRIDES) -> None:
        if weight.dim() != 2:
            raise ValueError(f"{name}: bf16 weight must be [N, K], got {tuple(weight.shape)}")
        self.name = name
        self.weight = weight.to(torch.bfloat16).contiguous()
        self.n, self.k = int(weight.shape[0]), int(weight.shape[1])
        # choice.passed: the kernels tried before (higher priority or forced) and why not
        self.choice = (Bf16Choice(TORCH_KERNEL_ID, (), None, TORCH_KERNEL_ID) if hw is None
                       else bf16_choice(hw, overrides))
        self.kernel_id = self.choice.kernel_id
        self.reason = "no hardware profile" if hw is None else self.choice.reason
        self._gemm: Bf16Gemm | None = None
        self._lock = threading.Lock()

    def gemm(self) -> Bf16Gemm | None:
        """The packed C++ GEMM (packed on first use), or None on the torch path."""
        if self.reason is not None:
            return None
        with self._lock:
            if self._gemm is None:
                self._gemm = Bf16Gemm.prepare(self.weight, self.kernel_id)
            return self._gemm

    def __call__(self, x: torch.Tensor, generated: torch.Tensor | None = None) -> torch.Tensor:
        """``generated`` (row roles, see Fp8Linear) plays no part: one kernel for every row."""
        gemm = self.gemm()
        return torch.mm(x, self.weight.t()) if gemm is None else gemm(x)

    def fp32(self, x: torch.Tensor) -> torch.Tensor:
        """x [M, K] bf16 -> y [M, N] fp32 (the C++ GEMM's accumulators, unrounded)."""
        gemm = self.gemm()
        return torch.mm(x, self.weight.t()).float() if gemm is None else gemm(x, out_fp32=True)


class Fp8Linear:
    """y [M, N] bf16 = x [M, K] bf16 @ dequant(W).T through the layer's chosen kernel.
    The decoder keeps its activations in host memory, so kernels come from the CPU tables
    even on a host with an XPU or CUDA device."""

    def __init__(self, name: str, weight: Fp8Weight | WeightSource, hw: HardwareInfo,
                 overrides: KernelOverrides, report: KernelReport) -> None:
        """``weight``: the (mapped) weight, or a WeightSource that builds it (fused
        shards); the kernel keeps only its packed copy (engine/kernels/layer_kernel.py)."""
        self.name = name
        self.kernel = LayerKernel(name, weight, hw, overrides, report, platform=Platform.CPU)
        self.n, self.k = self.kernel.n, self.kernel.k

    def __call__(self, x: torch.Tensor, generated: torch.Tensor | None = None) -> torch.Tensor:
        """``generated``: uint8 [M] row roles (AttentionMetadata.generated_rows), or None."""
        return self.kernel(x, generated)


Linear = Bf16Linear | Fp8Linear


@dataclass(frozen=True, slots=True)
class LinearFactory:
    """Builds the right linear module for a weight; carries the kernel-selection inputs."""

    hw: HardwareInfo
    overrides: KernelOverrides
    report: KernelReport

    def __call__(self, name: str, weight: LinearWeight | WeightSource) -> Linear:
        """Fp8Linear for an Fp8Weight or WeightSource (built when packed), else Bf16Linear."""
        if isinstance(weight, (Fp8Weight, WeightSource)):
            return Fp8Linear(name, weight, self.hw, self.overrides, self.report)
        module = Bf16Linear(name, weight, self.hw, self.overrides)
        choice = module.choice
        if choice.warning:  # the runner logs them once, grouped (forced_warnings)
            log.debug("%s: %s", name, choice.warning)
        self.report.record_choice(LayerChoice(
            name, module.kernel_id, "cpu", BF16_SCALE_KIND, module.n, module.k,
            tuple(Rejection(k, why) for k, why in choice.passed), choice.warning,
            first_choice=choice.first))
        return module

    def fused(self, name: str, parts: dict[str, LinearWeight]) -> FusedLinear:
        """One GEMM over the concatenated rows of ``parts`` when they fuse exactly (see
        fuse_weights), else one module per part. FP8 shards are concatenated only to be
        packed: the layer keeps the mapped shards and re-fuses them if it must prepare
        again, so no fused FP8 copy outlives construction."""
        weights = list(parts.values())
        sizes = tuple(int(w.n if isinstance(w, Fp8Weight) else w.shape[0]) for w in weights)
        if all(isinstance(w, Fp8Weight) for w in weights):
            shards: list[Fp8Weight] = weights  # type: ignore[assignment]
            if fp8_fuse_reason(shards) is None:
                source = WeightSource(tuple(shards), combine=_fuse_fp8_checked)
                return FusedLinear((Fp8Linear(name, source, self.hw, self.overrides,
                                              self.report),), sizes)
        else:
            merged = fuse_weights(weights)
            if merged is not None:
                return FusedLinear((self(name, merged),), sizes)
        return FusedLinear(tuple(self(f"{name}.{k}", w) for k, w in parts.items()), sizes)


@dataclass(frozen=True, slots=True)
class FusedLinear:
    """Several linears of the same input. x [M, K] bf16 -> one [M, n_i] bf16 per part
    (views into one GEMM output when fused)."""

    modules: tuple[Linear, ...]
    sizes: tuple[int, ...]  # output features of each part, in order

    @property
    def is_fused(self) -> bool:
        return len(self.modules) == 1 and len(self.sizes) > 1

    def __call__(self, x: torch.Tensor,
                 generated: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
        if len(self.modules) == 1:
            return torch.split(self.modules[0](x, generated), list(self.sizes), dim=-1)
        return tuple(m(x, generated) for m in self.modules)


def _per_channel(w: Fp8Weight) -> torch.Tensor:
    """The shard's scale as fp32 [N]."""
    if w.scale_kind is ScaleKind.PER_CHANNEL:
        return w.scale
    return w.scale.reshape(()).expand(w.n)


def _fused_act_scale(ws: list[Fp8Weight]) -> torch.Tensor | None:
    scales = [w.activation_scale for w in ws]
    if any(s is None for s in scales):
        return None
    return torch.stack(scales).max()  # type: ignore[arg-type]


def fp8_fuse_reason(ws: list[Fp8Weight]) -> str | None:
    """None when the FP8 shards fuse exactly (see fuse_fp8), else why not. Reads only
    shapes and scale kinds: no tensor data."""
    if len({w.k for w in ws}) != 1:
        return "shards differ in K"
    kinds = {w.scale_kind for w in ws}
    if ScaleKind.BLOCK not in kinds:
        return None
    if kinds != {ScaleKind.BLOCK} or len({w.block_size for w in ws}) != 1:
        return "block-scaled shards mixed with other scales or block sizes"
    bn = ws[0].block_size[0]
    if any(w.n % bn for w in ws):
        return f"a shard's N is not a multiple of the block's {bn} rows"
    return None


def fuse_fp8(ws: list[Fp8Weight]) -> Fp8Weight | None:
    """Concatenate FP8 rows unchanged (no requantization). Per-tensor/per-channel shards
    become one PER_CHANNEL weight with scale fp32 [N_total]; block-scaled shards fuse by
    concatenating block-scale rows when each shard's N is a multiple of the block's bn.
    None when the shards cannot fuse exactly (mixed K, mixed block sizes, ragged N).
    The result is a new anonymous [sum N, K] fp8 tensor (the shards are only read)."""
    if fp8_fuse_reason(ws) is not None:
        return None
    weight = torch.cat([w.weight for w in ws], dim=0)
    act = _fused_act_scale(ws)
    if ws[0].scale_kind is ScaleKind.BLOCK:
        scale = torch.cat([w.scale for w in ws], dim=0)
        return Fp8Weight(weight, scale, ScaleKind.BLOCK, act, ws[0].block_size)
    scale = torch.cat([_per_channel(w) for w in ws]).to(torch.float32).contiguous()
    return Fp8Weight(weight, scale, ScaleKind.PER_CHANNEL, act)


def _fuse_fp8_checked(ws: list[Fp8Weight]) -> Fp8Weight:
    fused = fuse_fp8(ws)
    if fused is None:
        raise ValueError(f"FP8 shards no longer fuse: {fp8_fuse_reason(ws)}")
    return fused


def fuse_weights(ws: list[LinearWeight]) -> LinearWeight | None:
    """Row-concatenate linears of the same input: all FP8 (see fuse_fp8) or all bf16."""
    if all(isinstance(w, Fp8Weight) for w in ws):
        return fuse_fp8(ws)  # type: ignore[arg-type]
    if all(isinstance(w, torch.Tensor) for w in ws):
        if len({int(w.shape[1]) for w in ws}) != 1:  # type: ignore[union-attr]
            return None
        return torch.cat([w.to(torch.bfloat16) for w in ws], dim=0)  # type: ignore[union-attr]
    return None
