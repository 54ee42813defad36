"""ModelRunner: BatchInputs (from the scheduler) -> logits, over the model and its paged
KV store. The scheduler allocates blocks (engine/kv/block_allocator.py) and names them in each
chunk's block_table; the runner owns the KV tensors and the per-layer kernel choices.

FP8SERVE_FUSED=0 forces the reference path (Python layers, SDPA attention, Bf16Linear head)
instead of the fused C++ layers where they apply (engine/model/decode_step.py)."""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from pathlib import Path

import torch

from engine.batch import BatchInputs, LogitsWanted, SeqChunk
from engine.config import ConfigError, EngineConfig, ModelConfig
from engine.hardware import HardwareInfo
from engine.kernels.layer_kernel import KernelReport, exactness_warning, forced_warnings
from engine.kernels.registry import KernelOverrides
from engine.memory import available_bytes, retain_heap, trim_heap
from engine.model.attention import build_metadata
from engine.model.kv_store import KV_DTYPE, KVStore, kv_torch_dtype, num_blocks_for
from engine.model.layers import LinearFactory
from engine.model.ministral import Ministral
from engine.weights import ModelWeights

log = logging.getLogger(__name__)


def logit_rows(batch: BatchInputs) -> torch.Tensor:
    """[num_logit_rows] int64: rows of the flattened step tokens whose logits are wanted,
    in chunk order (LAST: the chunk's last token; ALL: each of its tokens)."""
    rows: list[int] = []
    offset = 0
    for c in batch.chunks:
        if c.logits is LogitsWanted.LAST:
            rows.append(offset + c.num_tokens - 1)
        elif c.logits is LogitsWanted.ALL:
            rows.extend(range(offset, offset + c.num_tokens))
        offset += c.num_tokens
    return torch.tensor(rows, dtype=torch.int64)


def check_memory(config: ModelConfig, engine_config: EngineConfig,
                 available: int | None = None) -> None:
    """ConfigError naming the flags when the KV cache and the position tables they ask
    for exceed the memory the host has available (else the allocation fails with a
    traceback, or the kernel's OOM killer ends the process without a word)."""
    available = available_bytes() if available is None else available
    if available is None:
        return
    kv = engine_config.kv_cache_gib * 2**30
    # RopeTables: cos, sin (and the query-scaled pair with Llama-4 scaling), fp32, plus
    # the angles they are computed from: up to 5 tables of [max_model_len, head_dim / 2]
    rope = 5 * engine_config.max_model_len * (config.head_dim // 2) * 4
    if kv + rope > available:
        raise ConfigError(
            f"--kv-cache-gib {engine_config.kv_cache_gib:g} and --max-model-len "
            f"{engine_config.max_model_len} need {(kv + rope) / 2**30:.1f} GiB (KV cache "
            f"{kv / 2**30:.1f}, position tables {rope / 2**30:.1f}); the host has "
            f"{available / 2**30:.1f} GiB available")


def kernel_line(report: KernelReport) -> str:
    """Which kernel runs how many linears (the lm_head included), for the startup log:
    ``120 on avx512_w8a16 (per_channel 60, per_tensor 60), 1 on bf16_avx512 (bf16)``,
    and the kernels generated rows run on where they differ (fp8serve kernels --model
    and /kernels give the whole report)."""
    by_kernel: dict[str, dict[str, int]] = {}
    for (kernel, _, scale), n in sorted(report.selected_counts().items()):
        by_kernel.setdefault(kernel, {})[scale] = n
    parts = [f"{sum(scales.values())} on {kernel} ("
             + ", ".join(f"{s} {n}" for s, n in scales.items()) + ")"
             for kernel, scales in by_kernel.items()]
    parts += [f"{n} run generated rows on {gen} (prompt rows on {kernel})"
              for (kernel, gen), n in sorted(report.generated_counts().items())]
    return ", ".join(parts) or "none"


class ModelRunner:
    def __init__(self, weights: ModelWeights, engine_config: EngineConfig, hw: HardwareInfo,
                 overrides: KernelOverrides, report: KernelReport | None = None) -> None:
        fused_env = os.environ.get("FP8SERVE_FUSED", "")
        if fused_env not in ("", "0", "1"):
            raise ValueError(f"FP8SERVE_FUSED={fused_env!r}: 0 (the Python reference layers) "
                             "or 1 / unset (the fused op where it runs)")
        eager = fused_env == "0"
        if engine_config.threads is not None:
            torch.set_num_threads(engine_config.threads)
        self.config: ModelConfig = weights.config
        self.engine_config = engine_config
        check_memory(self.config, engine_config)
        window = self.config.sliding_window
        if window is not None and engine_config.max_model_len > window:
            raise ConfigError(
                f"the checkpoint's sliding_window is {window}: sliding-window attention is "
                f"not implemented, and --max-model-len {engine_config.max_model_len} lets a "
                f"query reach keys outside the window; serve it with --max-model-len "
                f"{window} or less (every key is then inside the window)")
        if engine_config.max_model_len > self.config.max_position_embeddings:
            log.warning("max_model_len %d exceeds the model's max_position_embeddings %d: "
                        "positions past it are beyond what the model was trained on",
                        engine_config.max_model_len, self.config.max_position_embeddings)
        self.kernel_report = report if report is not None else KernelReport()
        if overrides.rows_by_role is None:  # the engine's policy (EngineConfig.rows_by_role)
            overrides = replace(overrides, rows_by_role=engine_config.rows_by_role_on)
        self.overrides = overrides  # as the layers were built with them
        make = LinearFactory(hw, overrides, self.kernel_report)
        self.model = Ministral(weights, make, max_positions=engine_config.max_model_len,
                               fuse=False if eager else None,
                               lm_head_dtype=engine_config.lm_head_dtype,
                               fuse_off="FP8SERVE_FUSED=0 (the Python reference layers)")
        kv_dtype = kv_torch_dtype(engine_config.kv_cache_dtype)
        fp8 = kv_dtype != KV_DTYPE
        if eager:  # the reference path: Python layers, SDPA attention, Bf16Linear head
            self.model.attention.turn_off("FP8SERVE_FUSED=0 (the Python reference layers)")
        self.kernel_report.attention_state = self.model.attention.describe
        for line in forced_warnings(self.kernel_report):
            log.warning(line)
        if (note := exactness_warning(self.kernel_report, overrides)) is not None:
            log.warning(note)
        self.kernel_report.decoder_reasons = lambda: self.model.fusion_reasons
        # some linear (the head included) runs generated rows on another kernel: each step
        # then marks its rows' roles (a runtime fallback only ever turns a split off)
        self._roles = bool(self.kernel_report.generated_counts())
        reasons = self.model.fusion_reasons
        why = next((r for r in reasons if r), None)
        log.info("kernels: %s", kernel_line(self.kernel_report))
        if engine_config.rows_by_role == "on" and not self.kernel_report.rows_by_role():
            log.warning("rows_by_role on: no layer runs its generated rows on another kernel "
                        "here (an AMX host's tile kernels do, unless a kernel is forced or "
                        "avx512_w8a16 is disabled); every row runs its layer's kernel")
        log.info("fused C++ layers: %d of %d%s", reasons.count(None), len(reasons),
                 f" (not fused: {why})" if why else "")
        trim_heap()  # holes left by the per-layer fused copies, before the KV cache
        if engine_config.heap_retain_mib and not retain_heap(engine_config.heap_retain_mib
                                                             * 2**20):
            log.warning("heap_retain_mib: this C library has no usable mallopt; step "
                        "buffers are mapped and unmapped by its defaults")
        self.block_size = engine_config.kv_block_size
        self.num_kv_blocks = num_blocks_for(self.config, engine_config)
        self.kv = KVStore.allocate(self.config, self.num_kv_blocks, self.block_size,
                                   kv_dtype, weights.kv_scales if fp8 else None)
        log.info("KV store: %d blocks of %d tokens, %s (%.1f MiB, %d bytes per block)",
                 self.num_kv_blocks, self.block_size, self.kv_dtype, self.kv.nbytes / 2**20,
                 self.kv.bytes_per_block)

    @property
    def kv_bytes_per_block(self) -> int:
        return self.kv.bytes_per_block

    @property
    def rows_by_role(self) -> bool:
        """Whether some layer runs generated rows on another kernel than prompt rows
        (engine/kernels/amx.py): the prefix cache then keys blocks by role too."""
        return self.kernel_report.rows_by_role()

    @property
    def kv_dtype(self) -> str:
        """The K/V element type ("bfloat16" | "float8_e4m3fn"); part of every prefix-cache
        block key."""
        return str(self.kv.kv.dtype).removeprefix("torch.")

    @torch.inference_mode()
    def run(self, batch: BatchInputs) -> torch.Tensor:
        """Logits float32 [batch.num_logit_rows, vocab], rows in chunk order; each chunk
        contributes chunk.num_logit_rows rows (NONE: 0, LAST: 1, ALL: one per token).
        Chunks' embeds (bf16 [N, H], engine/batch.py ChunkEmbeds) replace the embeddings
        of the tokens they name."""
        return self._step(batch, self.model.forward)

    @torch.inference_mode()
    def hidden(self, batch: BatchInputs) -> torch.Tensor:
        """As :meth:`run`, but the lm_head's input: bf16 [batch.num_logit_rows, hidden]
        (for benchmarks that compare heads on the same hidden states)."""
        return self._step(batch, self.model.hidden)

    def _step(self, batch: BatchInputs, fn) -> torch.Tensor:
        meta = build_metadata(batch, self.block_size, self.kv.num_slots,
                              spans=not self.model.attention.use_ext, roles=self._roles)
        ids = [t for c in batch.chunks for t in c.token_ids]
        vocab = self.config.vocab_size
        if ids and (min(ids) < 0 or max(ids) >= vocab):
            raise ValueError(f"token id outside the vocabulary [0, {vocab})")
        tokens = torch.tensor(ids, dtype=torch.int64)  # [T]
        return fn(tokens, meta, self.kv, logit_rows(batch), embeds=batch.embed_rows())


def load_runner(model_dir: str | Path, engine_config: EngineConfig,
                hw: HardwareInfo | None = None,
                overrides: KernelOverrides | None = None,
                layout: str | None = None) -> ModelRunner:
    """Load a checkpoint directory and build its runner (hw None = probe this host;
    overrides None = from FP8SERVE_KERNEL / FP8SERVE_DISABLED_KERNELS; layout "hf" or
    "native" where the directory holds both, None = detect)."""
    from engine.loader import load_weights

    if hw is None:  # first: a bad FP8SERVE_ISA stops it before the weights load
        from engine.hardware_probe import probe_hardware

        hw = probe_hardware()
    weights = load_weights(Path(model_dir), layout=layout)
    if overrides is None:
        overrides = KernelOverrides.from_env()
    return ModelRunner(weights, engine_config, hw, overrides)


def generate_greedy(runner: ModelRunner, prompt_ids: list[int], max_new_tokens: int,
                    seq_id: int = 0) -> list[int]:
    """Greedy decoding of one sequence with the KV cache (prefill once, then one token per
    step) in blocks 0.. of the runner's store. For tests, calibration and the CLI."""
    total = len(prompt_ids) + max_new_tokens
    blocks = tuple(range(-(-total // runner.block_size)))
    if len(blocks) > runner.num_kv_blocks:
        raise ValueError(f"{total} tokens need {len(blocks)} KV blocks; "
                         f"{runner.num_kv_blocks} available")
    out: list[int] = []
    n = len(prompt_ids)
    chunk = SeqChunk(seq_id, tuple(prompt_ids), 0, blocks, prompt_len=n)
    for _ in range(max_new_tokens):
        logits = runner.run(BatchInputs((chunk,)))
        nxt = int(torch.argmax(logits[0]))
        out.append(nxt)
        chunk = SeqChunk(seq_id, (nxt,), chunk.start_pos + chunk.num_tokens, blocks,
                         prompt_len=n)
    return out
