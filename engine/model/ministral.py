"""The Ministral-3 text decoder (also Mistral / Llama text models): pre-norm blocks of
GQA attention with RoPE and a SwiGLU MLP, bf16 activations.

    tokens [T] int64 --embed--> h [T, H] bf16 --layers--> final norm on the logit rows
    (:meth:`Ministral.hidden`, [R, H] bf16) --lm_head--> logits [R, V] fp32

The lm_head is bf16 or FP8 as ``lm_head_dtype`` says (engine/model/lm_head.py); an FP8
head runs on the registry's FP8 kernels like any decoder linear.

Every FP8 linear runs through a LayerKernel (engine/model/layers.py); q/k/v and gate/up
are fused into one GEMM each when their shards fuse exactly. A layer whose linears all run
on one of the AVX-512, AMX or AVX2 FP8 kernels runs as one C++ op
(engine/model/decode_step.py); the Python DecoderLayer is the reference and the path for
every other kernel.
"""

from __future__ import annotations

import logging

import torch
import torch.nn.functional as F

from engine.config import ModelConfig
from engine.memory import release_pages
from engine.model.attention import AttentionMetadata, PagedAttention
from engine.model.decode_step import (
    FusedDecodeLayer,
    FusedDecodeStack,
    PackedBf16Head,
    fusion_reason,
)
from engine.model.kv_store import KVStore, LayerKV
from engine.model.layers import (
    Fp8Linear,
    Linear,
    LinearFactory,
    RopeTables,
    StepRope,
    apply_rope,
    rms_norm,
)
from engine.model.lm_head import head_weight
from engine.weights import LayerWeights, ModelWeights

log = logging.getLogger(__name__)


def _heads_qk(q: torch.Tensor, k: torch.Tensor, d: int) -> torch.Tensor:
    """q [T, Hq*D], k [T, Hkv*D] -> [T, Hq + Hkv, D]: a view when both are adjacent column
    slices of one fused GEMM output, else a concatenation."""
    t = q.shape[0]
    fused = (q.stride() == k.stride() and
             k.data_ptr() == q.data_ptr() + q.shape[1] * q.element_size())
    if fused:
        return q.as_strided((t, (q.shape[1] + k.shape[1]) // d, d), (q.stride(0), d, 1))
    return torch.cat((q, k), dim=1).view(t, -1, d)


class DecoderLayer:
    def __init__(self, i: int, w: LayerWeights, config: ModelConfig, make: LinearFactory,
                 attention: PagedAttention) -> None:
        p = f"layers.{i}"
        self.eps = config.rms_norm_eps
        self.hq, self.hkv, self.d = config.num_heads, config.num_kv_heads, config.head_dim
        self.input_norm = w.input_layernorm
        self.post_norm = w.post_attention_layernorm
        self.qkv = make.fused(f"{p}.self_attn.qkv_proj",
                              {"q_proj": w.q_proj, "k_proj": w.k_proj, "v_proj": w.v_proj})
        self.o_proj: Linear = make(f"{p}.self_attn.o_proj", w.o_proj)
        self.gate_up = make.fused(f"{p}.mlp.gate_up_proj",
                                  {"gate_proj": w.gate_proj, "up_proj": w.up_proj})
        self.down_proj: Linear = make(f"{p}.mlp.down_proj", w.down_proj)
        self.attention = attention

    def __call__(self, h: torch.Tensor, rope: StepRope, meta: AttentionMetadata,
                 cache: LayerKV) -> torch.Tensor:
        """h [T, H] bf16 -> [T, H] bf16; writes this layer's K/V of the step into cache."""
        t, g = h.shape[0], meta.generated_rows
        q, k, v = self.qkv(rms_norm(h, self.input_norm, self.eps), g)
        qk = apply_rope(_heads_qk(q, k, self.d), rope)
        q, k = qk[:, : self.hq], qk[:, self.hq:]
        attn = self.attention(q, k, v.reshape(t, self.hkv, self.d), cache, meta)
        h = h + self.o_proj(attn, g)
        gate, up = self.gate_up(rms_norm(h, self.post_norm, self.eps), g)
        return h + self.down_proj(F.silu(gate) * up, g)


class Ministral:
    """The decoder built from :class:`ModelWeights`. Holds no per-request state: the KV
    store and the step's metadata are passed to :meth:`forward`."""

    def __init__(self, weights: ModelWeights, make: LinearFactory, max_positions: int,
                 fuse: bool | None = None, lm_head_dtype: str = "auto",
                 fuse_off: str = "fusion disabled") -> None:
        """``fuse``: run eligible layers as one C++ op (None = whenever possible; False =
        always the Python layers, each with the reason ``fuse_off``). ``lm_head_dtype``:
        auto | bf16 | fp8 (lm_head.py)."""
        c = weights.config
        self.config = c
        self.embed = weights.embed_tokens  # [V, H] bf16
        self.norm = weights.norm
        self.attention = PagedAttention(c.num_heads, c.num_kv_heads, c.head_dim)
        # The head first: packing it briefly holds the mapped [V, H] table and its packed
        # copy, which costs least while nothing else is resident yet.
        self.lm_head: Linear | PackedBf16Head = self._build_head(weights, make, fuse,
                                                                 lm_head_dtype)
        # Layer by layer: each layer's kernels pack its weights and release their mapped
        # pages, so the peak is what is packed so far plus one layer's originals.
        self.layers = [DecoderLayer(i, lw, c, make, self.attention)
                       for i, lw in enumerate(weights.layers)]
        if len(self.layers) != c.num_layers:
            raise ValueError(f"{len(self.layers)} layers of weights, config says {c.num_layers}")
        self.rope = RopeTables.build(c.rope, c.head_dim, max_positions)
        self.fused: list[FusedDecodeLayer | None] = []
        self.fusion_reasons: list[str | None] = []
        self.set_fusion(fuse, fuse_off)

    @staticmethod
    def _build_head(weights: ModelWeights, make: LinearFactory, fuse: bool | None,
                    lm_head_dtype: str) -> Linear | PackedBf16Head:
        """The lm_head. FP8: an Fp8Linear on the registry's kernel (bf16 logits). BF16: on
        the packed C++ GEMM (fp32 logits from the accumulators, one copy of the table)
        unless fusion is off. Once packed, the mapped table's pages are released: a tied
        head's embedding then keeps only the rows lookups touch."""
        head = head_weight(weights, lm_head_dtype)
        module = make("lm_head", head)
        if isinstance(module, Fp8Linear):
            return module
        packed = PackedBf16Head.replacing(module) if fuse is not False else None
        if packed is None:
            return module
        if isinstance(head, torch.Tensor):
            release_pages(head)
        return packed

    def set_fusion(self, fuse: bool | None, off: str = "fusion disabled") -> None:
        """(Re)decide which layers run as one C++ op; reasons kept in fusion_reasons
        (``off`` for every layer when ``fuse`` is False)."""
        reasons = [fusion_reason(layer) if fuse is not False else off for layer in self.layers]
        if fuse and any(reasons):
            raise ValueError(f"cannot fuse every layer: {next(r for r in reasons if r)}")
        self.fusion_reasons = reasons
        self._fused_ok: set[int] = set()  # layers whose fused op has run once
        self.stack: FusedDecodeStack | None = None  # once every fused layer has run once
        self.fused = [FusedDecodeLayer.of(layer) if why is None else None
                      for layer, why in zip(self.layers, reasons, strict=True)]

    def _fused_layer(self, i: int, h: torch.Tensor, meta: AttentionMetadata,
                     cache: LayerKV) -> torch.Tensor | None:
        """Layer i as one op; None if its first call failed (the layer then stays on the
        Python path, whose kernels the report names). Later errors propagate."""
        fused = self.fused[i]
        assert fused is not None
        try:
            out = fused(h, self.rope, meta, cache)
        except RuntimeError as exc:
            if i in self._fused_ok:
                raise
            log.warning("layers.%d: fused decode layer failed (%s); using the Python layer",
                        i, exc)
            self.fused[i] = None
            self.fusion_reasons[i] = f"runtime error: {exc}"
            return None
        self._fused_ok.add(i)
        return out

    def forward(self, tokens: torch.Tensor, meta: AttentionMetadata, kv: KVStore,
                logit_rows: torch.Tensor,
                embeds: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """tokens [T] int64, logit_rows [R] int64 (rows of T) -> logits [R, V] fp32.
        embeds: (rows [N] int64 of T, values [N, H] bf16) replacing those rows' token
        embeddings (image features)."""
        h = self.hidden(tokens, meta, kv, logit_rows, embeds)
        if h.shape[0] == 0:  # only filling the KV cache
            return torch.empty(0, self.config.vocab_size, dtype=torch.float32)
        if isinstance(self.lm_head, Fp8Linear) and meta.generated_rows is not None:
            return self.lm_head(h, meta.generated_rows.index_select(0, logit_rows)).float()
        return self.lm_head(h).float()

    def hidden(self, tokens: torch.Tensor, meta: AttentionMetadata, kv: KVStore,
               logit_rows: torch.Tensor,
               embeds: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        """tokens [T] int64, logit_rows [R] int64 -> the lm_head's input [R, H] bf16 (the
        final-normed hidden states of those rows); writes the step's K/V. embeds: as in
        :meth:`forward`."""
        h = F.embedding(tokens, self.embed)
        if embeds is not None:
            rows, values = embeds
            if values.shape != (rows.shape[0], h.shape[1]) or values.dtype != h.dtype:
                raise ValueError(f"input embeddings must be {h.dtype} [{rows.shape[0]}, "
                                 f"{h.shape[1]}], got {values.dtype} {list(values.shape)}")
            h.index_copy_(0, rows, values)
        if meta.positions.numel() and int(meta.positions.max()) >= self.rope.max_positions:
            raise ValueError(f"position {int(meta.positions.max())} beyond the rotary table "
                             f"({self.rope.max_positions} positions = max_model_len)")
        if self.stack is not None:
            h = self.stack(h, self.rope, meta, kv)
        else:
            h = self._layers(h, meta, kv)
        return rms_norm(h.index_select(0, logit_rows), self.norm, self.config.rms_norm_eps)

    def _layers(self, h: torch.Tensor, meta: AttentionMetadata, kv: KVStore) -> torch.Tensor:
        """Layer by layer (fused ops checked on their first call, Python layers)."""
        c = self.config
        rope: StepRope | None = None
        for i, layer in enumerate(self.layers):
            if self.fused[i] is not None:
                out = self._fused_layer(i, h, meta, kv.layer(i))
                if out is not None:
                    h = out
                    continue
            if rope is None:  # built once per step, only when a Python layer runs
                rope = StepRope.select(self.rope, meta.positions, c.num_heads, c.num_kv_heads)
            h = layer(h, rope, meta, kv.layer(i))
        if len(self._fused_ok) == len(self.layers) and kv.kv.is_contiguous() and (
                kv.scales is None or kv.scales.is_contiguous()):
            self.stack = FusedDecodeStack.of([f for f in self.fused if f is not None])
        return h
