"""Typed, frozen configuration: what the model is (ModelConfig) and how the engine runs
(EngineConfig). Both validate on construction; parsing from checkpoint files lives in
engine/checkpoint/ (the loader), not here."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from engine.kernels.base import DEFAULT_BLOCK, ScaleKind

if TYPE_CHECKING:
    from engine.spec.config import SpeculativeConfig

# --lm-head-dtype: auto = the checkpoint's, or force bf16 / fp8 (engine/model/lm_head.py)
LM_HEAD_DTYPES = ("auto", "bf16", "fp8")
KV_CACHE_DTYPES = ("auto", "bf16", "fp8")  # vLLM's --kv-cache-dtype; fp8 = e4m3, auto = bf16
# vLLM's --logprobs-mode: what a reported logprob is (engine/sampler.py's docstring)
LOGPROBS_MODES = ("processed_logprobs", "raw_logprobs", "processed_logits", "raw_logits")
# --rows-by-role: whether a layer's generated rows (decode, draft verification) may run
# another kernel than its prompt rows (AMX hosts: avx512_w8a16 beside the tiles,
# engine/kernels/amx.py). auto: only an engine whose steps decode one row, one sequence at
# a time (max_num_seqs 1) and no speculative decoding (its drafts are verified several
# rows at once). Measured on a 2-core Xeon with AMX (docs/performance.md "AMX hosts"): per
# layer of the 3B shape the GEMV takes 0.79-0.91x the tiles' time at 1 row, 1.03-1.14x at
# 2, 1.3-1.5x at 4 and 4-5x at 16; served, the demo model's split decodes one stream
# 1.07-1.16x faster than the tiles alone but 2, 4, 8 and 16 concurrent streams at
# 0.91-0.97x, 0.90-0.92x, 0.75-0.78x and 0.65-0.68x.
ROWS_BY_ROLE = ("auto", "on", "off")


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field."""


def _require(cond: bool, msg: str) -> None:
    if not cond:
        raise ConfigError(msg)


@dataclass(frozen=True, slots=True)
class RopeConfig:
    """Rotary embedding, half-split layout. rope_type "default" is plain RoPE; "yarn" uses
    factor/original_max_position_embeddings/beta_fast/beta_slow/mscale/mscale_all_dim, an
    explicit attention_factor (the cos/sin multiplier; None: from factor and the mscales)
    and truncate (round the correction range to whole dimensions), as transformers reads
    them. llama_4_scaling_beta > 0 scales q after RoPE by
    1 + beta * ln(1 + floor(pos / original_max_position_embeddings)); 0 turns it off."""

    theta: float = 10000.0
    rope_type: str = "default"  # "default" | "yarn"
    factor: float = 1.0
    original_max_position_embeddings: int = 4096
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    llama_4_scaling_beta: float = 0.0
    attention_factor: float | None = None
    truncate: bool = True

    def __post_init__(self) -> None:
        _require(self.rope_type in ("default", "yarn"), f"rope_type {self.rope_type!r} unsupported")
        _require(self.attention_factor is None or (self.attention_factor > 0 and math.isfinite(
            self.attention_factor)), "rope attention_factor must be a finite number > 0")
        _require(self.theta > 0 and math.isfinite(self.theta),
                 "rope theta must be a finite number > 0")
        _require(self.factor >= 1.0, "rope factor must be >= 1")
        _require(self.original_max_position_embeddings > 0, "original_max_position_embeddings > 0")


@dataclass(frozen=True, slots=True)
class QuantConfig:
    """How decoder linears are stored. method "none" = bf16 checkpoint."""

    method: str = "none"  # "fp8" | "none"
    scale_kind: ScaleKind = ScaleKind.PER_TENSOR  # PER_TENSOR or BLOCK on disk
    block_size: tuple[int, int] = DEFAULT_BLOCK
    activation_scheme: str = "static"  # "static" | "dynamic"
    modules_to_not_convert: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _require(self.method in ("fp8", "none"), f"quant_method {self.method!r} unsupported")


@dataclass(frozen=True, slots=True)
class ModelConfig:
    """The Ministral-3 text decoder (also Mistral / Llama text models)."""

    architecture: str  # as found in config.json / inferred for params.json
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    rope: RopeConfig = field(default_factory=RopeConfig)
    quant: QuantConfig = field(default_factory=QuantConfig)
    bos_token_id: int | None = 1
    eos_token_ids: tuple[int, ...] = (2,)
    has_vision: bool = False  # multimodal checkpoint: vision weights present, not served
    # keys a query attends are those fewer than this many positions back (transformers'
    # sliding-window mask); None: all earlier keys. Served only where --max-model-len keeps
    # every key inside the window (ModelRunner), so attention stays plain causal.
    sliding_window: int | None = None

    def __post_init__(self) -> None:
        for name in ("hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "vocab_size", "max_position_embeddings"):
            _require(getattr(self, name) > 0, f"{name} must be > 0")
        for name, ids in (("bos_token_id", () if self.bos_token_id is None
                           else (self.bos_token_id,)), ("eos_token_id", self.eos_token_ids)):
            bad = [i for i in ids if not 0 <= i < self.vocab_size]
            _require(not bad, f"{name} {bad[0] if bad else ''} is outside the vocabulary "
                              f"[0, {self.vocab_size})")
        _require(self.num_heads % self.num_kv_heads == 0,
                 f"num_heads {self.num_heads} not a multiple of num_kv_heads {self.num_kv_heads}")
        _require(self.head_dim % 2 == 0, "head_dim must be even for RoPE")
        _require(self.sliding_window is None or self.sliding_window > 0,
                 "sliding_window must be > 0 or null")
        _require(self.rms_norm_eps > 0 and math.isfinite(self.rms_norm_eps),
                 f"rms_norm_eps must be a finite number > 0, got {self.rms_norm_eps}")
        _require(isinstance(self.tie_word_embeddings, bool),
                 f"tie_word_embeddings must be true or false, got {self.tie_word_embeddings!r}")

    @property
    def q_size(self) -> int:
        return self.num_heads * self.head_dim

    @property
    def kv_size(self) -> int:
        return self.num_kv_heads * self.head_dim

    def kv_bytes_per_token(self, dtype_bytes: int = 2) -> int:
        return 2 * self.num_layers * self.kv_size * dtype_bytes


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How the engine runs a model. Built from service settings or CLI flags."""

    model_dir: Path
    max_num_seqs: int = 16
    max_model_len: int = 4096
    kv_cache_gib: float = 1.0
    kv_block_size: int = 16
    max_num_batched_tokens: int = 512  # prefill chunk budget per step
    # prefill tokens in a step that also carries decodes; 0 = the rest of the budget (as
    # vLLM). A cap trades throughput and ITL p50 for TTFT p50 and ITL p99: measured in
    # docs/performance.md ("prefill cap"), by `bench serve --compare-server-arg`
    max_prefill_tokens_with_decodes: int = 0
    # share computed KV blocks between requests with the same leading tokens (engine/kv/)
    enable_prefix_caching: bool = True
    # fcfs, or priority: requests' priority orders the queue and preemption
    # (engine/scheduler.py SCHEDULING_POLICIES)
    scheduling_policy: str = "fcfs"
    threads: int | None = None  # torch intra-op threads; None = all cores
    # freed step buffers the malloc heap keeps for the next step (engine/memory.py
    # retain_heap); 0 = the C library's defaults
    heap_retain_mib: int = 256
    kernel: str | None = None  # FP8SERVE_KERNEL: force these kernel ids (an FP8 and a bf16)
    disabled_kernels: tuple[str, ...] = ()  # FP8SERVE_DISABLED_KERNELS
    lm_head_dtype: str = "auto"  # LM_HEAD_DTYPES (engine/model/lm_head.py)
    kv_cache_dtype: str = "auto"  # KV_CACHE_DTYPES (engine/model/kv_store.py)
    # --speculative-config (engine/spec/config.py SpeculativeConfig); None = off
    speculative_config: SpeculativeConfig | None = None
    # vLLM's --seed: the random state that requests without a seed of their own sample
    # from starts here when the engine thread starts; None = a different state each start
    seed: int | None = None
    logprobs_mode: str = "processed_logprobs"
    rows_by_role: str = "auto"  # ROWS_BY_ROLE

    def __post_init__(self) -> None:
        _require(self.max_num_seqs >= 1, "max_num_seqs must be >= 1")
        _require(self.max_model_len >= 2, "max_model_len must be >= 2")
        _require(self.kv_cache_gib > 0, "kv_cache_gib must be > 0")
        _require(self.kv_block_size >= 1, "kv_block_size must be >= 1")
        _require(self.max_num_batched_tokens >= 1, "max_num_batched_tokens must be >= 1")
        _require(self.max_prefill_tokens_with_decodes >= 0,
                 "max_prefill_tokens_with_decodes must be >= 0 (0: no cap)")
        _require(self.scheduling_policy in ("fcfs", "priority"),
                 f"scheduling_policy {self.scheduling_policy!r} is not fcfs or priority")
        _require(self.threads is None or self.threads >= 1, "threads must be >= 1")
        _require(self.heap_retain_mib >= 0, "heap_retain_mib must be >= 0")
        _require(self.lm_head_dtype in LM_HEAD_DTYPES,
                 f"lm_head_dtype {self.lm_head_dtype!r} is not one of "
                 f"{', '.join(LM_HEAD_DTYPES)}")
        _require(self.kv_cache_dtype in KV_CACHE_DTYPES,
                 f"kv_cache_dtype {self.kv_cache_dtype!r} is not one of "
                 f"{', '.join(KV_CACHE_DTYPES)}")
        _require(self.logprobs_mode in LOGPROBS_MODES,
                 f"logprobs_mode {self.logprobs_mode!r} is not one of "
                 f"{', '.join(LOGPROBS_MODES)}")
        _require(self.rows_by_role in ROWS_BY_ROLE,
                 f"rows_by_role {self.rows_by_role!r} is not one of {', '.join(ROWS_BY_ROLE)}")

    @property
    def rows_by_role_on(self) -> bool:
        """Whether generated rows may run their own kernel (ROWS_BY_ROLE; auto: only with
        max_num_seqs 1 and no speculative decoding)."""
        if self.rows_by_role == "auto":
            return self.max_num_seqs == 1 and self.speculative_config is None
        return self.rows_by_role == "on"
