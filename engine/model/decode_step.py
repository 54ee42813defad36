"""The fused decoder layer: one C++ op per layer (ext/csrc/decode_layer.cpp) instead of a
dozen eager torch ops, for every step once the model is on the AVX-512, AMX or AVX2 FP8
kernels.

    h [T, H] bf16 --rms_norm, qkv GEMM, RoPE, KV write, paged attention, o_proj, residual,
    rms_norm, gate_up GEMM, silu*mul, down GEMM, residual--> [T, H] bf16

The op calls the same FP8 GEMM as the layer's kernels, on the same packed weights (dims[5],
ext/csrc/decode_team.h GemmKind): the AVX-512 GEMM (gemm.h fp8_linear, what gemm_avx512
runs) for layers on avx512_w8a16 / avx512_block_w8a16, the AMX tile GEMM (gemm.h
amx_linear, what gemm_amx runs; dims[5] = GEMM_AMX) for layers on amx_w8a16 /
amx_block_w8a16, the AVX2 GEMM (gemm_avx2; dims[5] = GEMM_AVX2) for layers on avx2_w8a16 /
avx2_block_w8a16.
Layers on the AMX kernels whose generated rows run the AVX-512 one (LayerKernel
generated_kernel, engine/kernels/amx.py) pass the step's row roles (generated_rows): the op
runs those rows on the AVX-512 GEMM over the same packed weight, the prompt rows on the
tiles. So the kernel report stays true: each linear still runs on the kernel it reports. The
norms, RoPE, SwiGLU, residual adds and attention run at the extension's dispatch ISA
(AVX-512 from level avx512 on, else AVX2), in fp32 with the Python layer's bf16 roundings
but their own reduction order, so a fused layer's output is within an ulp or two of the
Python layer's, not bitwise equal. A model whose layers all fuse runs every step (prefill
and decode) through the op, so batched, chunked and solo runs keep identical bits.
:func:`fusion_reason` says why a layer cannot fuse (then the Python layer in ministral.py
runs; it is also the reference the fused op is tested against).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engine.kernels.avx2 import AVX2_LAYOUT
from engine.kernels.avx512 import GEMV_MAX_M, VNNI32_LAYOUT
from engine.kernels.bf16_linear import Bf16Gemm
from engine.model.attention import AVX512_ISAS, AttentionMetadata
from engine.model.kv_store import KVStore, LayerKV
from engine.model.layers import Bf16Linear, Fp8Linear, FusedLinear, Linear, RopeTables

AVX512_KERNELS = frozenset({"avx512_w8a16", "avx512_block_w8a16"})
AMX_KERNELS = frozenset({"amx_w8a16", "amx_block_w8a16"})
AVX2_KERNELS = frozenset({"avx2_w8a16", "avx2_block_w8a16"})
# dims[5] of a layer whose linears run the AMX / AVX2 kernels (decode_team.h kDimsAmx,
# kDimsAvx2); else GEMV_MAX_M (the AVX-512 GEMM)
GEMM_AMX = -1
GEMM_AVX2 = -2


@dataclass(frozen=True, slots=True)
class GemmFamily:
    """Kernels whose linears one fused op can call, their packed layout, the dispatch
    ISAs at which the op runs them (the first is the lowest), and the op's dims[5]."""

    name: str
    kernels: frozenset[str]
    layout: str
    isas: tuple[str, ...]
    dims5: int


AVX512 = GemmFamily("AVX-512", AVX512_KERNELS, VNNI32_LAYOUT, AVX512_ISAS, GEMV_MAX_M)
FAMILIES = (
    AVX512,
    GemmFamily("AMX", AMX_KERNELS, VNNI32_LAYOUT, AVX512_ISAS, GEMM_AMX),
    GemmFamily("AVX2", AVX2_KERNELS, AVX2_LAYOUT, ("avx2", *AVX512_ISAS), GEMM_AVX2),
)


def family_of(kernel_id: str) -> GemmFamily | None:
    return next((f for f in FAMILIES if kernel_id in f.kernels), None)


def _linear_reason(name: str, m: Linear) -> str | None:
    if not isinstance(m, Fp8Linear):
        return f"{name} is not an FP8 linear"
    p = m.kernel.packed
    fam = family_of(m.kernel.kernel.id)
    if fam is None or p.layout != fam.layout:
        return (f"{name} runs {m.kernel.kernel.id} ({p.layout}), not the AVX-512, AMX or "
                "AVX2 FP8 kernel")
    if m.kernel.bias is not None:
        return f"{name} has a bias"
    return None


def _fused_module(name: str, f: FusedLinear) -> tuple[Linear | None, str | None]:
    if len(f.modules) != 1:
        return None, f"{name} is not one fused GEMM"
    return f.modules[0], _linear_reason(name, f.modules[0])


def fusion_reason(layer) -> str | None:  # layer: ministral.DecoderLayer
    """None when ``layer`` can run as one decode_layer op, else why not."""
    import ext

    st = ext.load()
    if not st.built or not hasattr(torch.ops.fp8serve, "decode_layer"):
        return f"C++ extension without decode_layer ({st.error or 'old build'})"
    if not layer.attention.use_ext:
        return "attention runs on the SDPA path"
    for name, f in (("qkv_proj", layer.qkv), ("gate_up_proj", layer.gate_up)):
        if (why := _fused_module(name, f)[1]) is not None:
            return why
    for name, m in (("o_proj", layer.o_proj), ("down_proj", layer.down_proj)):
        if (why := _linear_reason(name, m)) is not None:
            return why
    ids = sorted({m.kernel.kernel.id for m in _modules(layer)})
    families = {family_of(i) for i in ids}
    if len(families) > 1:
        names = " and ".join(sorted(f.name for f in families if f is not None))
        return f"its linears mix the {names} GEMMs ({', '.join(ids)})"
    fam = families.pop()
    assert fam is not None
    if ext.isa() not in fam.isas:
        return f"dispatch ISA {ext.isa()} below {fam.isas[0]} (its linears run {ids[0]})"
    gen = {_generated_family(m) for m in _modules(layer)}
    if len(gen) > 1 or (gen != {None} and (fam.dims5 != GEMM_AMX or gen != {AVX512})):
        names = sorted(str(m.kernel.generated_kernel and m.kernel.generated_kernel.id)
                       for m in _modules(layer))
        return (f"its linears' generated rows run {', '.join(names)} (the op takes the "
                "AVX-512 GEMM for every linear of an AMX layer, or none)")
    return None


def _generated_family(m: Fp8Linear) -> GemmFamily | None:
    gen = m.kernel.generated_kernel
    return None if gen is None else family_of(gen.id)


def by_role(layer) -> bool:  # layer: ministral.DecoderLayer that passed fusion_reason
    """Whether the layer's op runs generated rows on the AVX-512 GEMM (generated_rows)."""
    return _generated_family(layer.down_proj) is not None


def _modules(layer) -> tuple[Fp8Linear, ...]:
    """The four FP8 linears of a layer that passed the per-linear checks."""
    return (layer.qkv.modules[0], layer.o_proj, layer.gate_up.modules[0], layer.down_proj)


def _gemm_args(m: Fp8Linear) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
    """(packed weight, scale, (block_n, block_k)); (0, 0) for per-channel scales."""
    p = m.kernel.packed
    block = p.meta.get("block", (0, 0))
    return p.tensors["weight"], p.tensors["scale"], block  # type: ignore[return-value]


@dataclass(frozen=True, slots=True)
class FusedDecodeLayer:
    """The op's per-layer arguments, built once (tensors shared with the layer's kernels)."""

    weights: tuple[torch.Tensor, ...]  # norms [H] bf16, then (packed weight, scale) x 4
    dims: tuple[int, ...]  # see decode_layer.cpp
    eps: float
    by_role: bool = False  # pass the step's generated_rows (layers on AMX, see by_role())

    @classmethod
    def of(cls, layer) -> FusedDecodeLayer:
        """From a ministral.DecoderLayer that passed :func:`fusion_reason`."""
        mods = _modules(layer)
        weights: list[torch.Tensor] = [layer.input_norm.contiguous(), layer.post_norm.contiguous()]
        blocks: list[int] = []
        for m in mods:
            w, s, (bn, bk) = _gemm_args(m)
            weights += [w, s]
            blocks += [int(bn), int(bk)]
        inter = layer.gate_up.sizes[0]
        fam = family_of(mods[0].kernel.kernel.id)
        assert fam is not None
        head = (layer.hq, layer.hkv, layer.d, inter, 0, fam.dims5)
        return cls(tuple(weights), head + tuple(blocks), float(layer.eps), by_role(layer))

    def __call__(self, h: torch.Tensor, tables: RopeTables, meta: AttentionMetadata,
                 cache: LayerKV) -> torch.Tensor:
        """h [T, H] bf16 -> [T, H] bf16; writes this layer's K/V of the step into cache
        (an fp8 cache with its per-row scales, as kv_write_fp8 writes them)."""
        p = meta.paged
        dims = list(self.dims)
        dims[4] = p.block_size
        rope = [tables.cos, tables.sin, tables.q_cos, tables.q_sin]
        fp8 = cache.fp8
        return torch.ops.fp8serve.decode_layer(
            h, list(self.weights), dims, self.eps, rope, meta.positions, cache.k, cache.v,
            meta.slot_mapping, [p.block_tables, p.token_seq, p.ctx_lens],
            cache.k_scale if fp8 else None, cache.v_scale if fp8 else None,
            cache.k_static if fp8 else 0.0, cache.v_static if fp8 else 0.0,
            meta.generated_rows if self.by_role else None)


@dataclass(frozen=True, slots=True)
class FusedDecodeStack:
    """Every layer in one decode_stack call (no Python between layers)."""

    weights: tuple[torch.Tensor, ...]  # the layers' FusedDecodeLayer.weights, in order
    dims: tuple[int, ...]  # the layers' dims, in order (block_size filled per call)
    eps: float
    num_layers: int
    by_role: bool = False  # every layer's FusedDecodeLayer.by_role

    @classmethod
    def of(cls, layers: list[FusedDecodeLayer]) -> FusedDecodeStack | None:
        """The stack, or None when the layers differ in eps or in by_role (then each
        layer runs its own op)."""
        if len({f.eps for f in layers}) != 1 or len({f.by_role for f in layers}) != 1:
            return None
        return cls(tuple(w for f in layers for w in f.weights),
                   tuple(d for f in layers for d in f.dims), layers[0].eps, len(layers),
                   layers[0].by_role)

    def __call__(self, h: torch.Tensor, tables: RopeTables, meta: AttentionMetadata,
                 store: KVStore) -> torch.Tensor:
        """h [T, H] bf16 -> [T, H] bf16; store.kv [L, 2, blocks, Hkv, block_size, D] bf16
        or float8_e4m3fn with store.scales [L, 2, blocks, Hkv, block_size] fp32 (written)."""
        p = meta.paged
        dims = list(self.dims)
        dims[4::14] = [p.block_size] * self.num_layers
        rope = [tables.cos, tables.sin, tables.q_cos, tables.q_sin]
        statics = [x for ks_vs in store.static_scales or () for x in ks_vs]
        return torch.ops.fp8serve.decode_stack(
            h, list(self.weights), dims, self.eps, rope, meta.positions, store.kv,
            meta.slot_mapping, [p.block_tables, p.token_seq, p.ctx_lens], store.scales,
            statics, meta.generated_rows if self.by_role else None)

class PackedBf16Head:
    """The bf16 lm_head on the batch-invariant C++ bf16 GEMM (engine/kernels/bf16_linear.py)
    holding only the packed copy: x [R, H] bf16 -> logits [R, V] fp32 straight from the
    fp32 accumulators. Replacing the Bf16Linear with this before its first call releases
    the unpacked [V, H] bf16 weight (for an untied head; a tied one is the embedding)."""

    def __init__(self, gemm: Bf16Gemm) -> None:
        self.gemm = gemm
        self.kernel_id = gemm.kernel_id

    @classmethod
    def replacing(cls, head: Linear) -> PackedBf16Head | None:
        """The packed head for a Bf16Linear on the C++ kernel, else None."""
        if not isinstance(head, Bf16Linear) or head.reason is not None:
            return None
        gemm = head.gemm()
        return None if gemm is None else cls(gemm)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.gemm(x, out_fp32=True)
