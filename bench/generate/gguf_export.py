"""Export a checkpoint's text weights to GGUF for the llama.cpp baseline of
`fp8serve bench generate` (benchmarks only; nothing at serve time reads GGUF).

Two file types, cached beside the checkpoint as ``<dir>.<QTYPE>.gguf``
(e.g. ``/models/synth-3b.Q8_0.gguf``):

    Q8_0  what Ollama makes of an FP8 checkpoint: every weight matrix, the tied
          embedding / lm_head included, in blocks of 32 with one fp16 scale
          (ggml's quantize_row_q8_0_ref: d = amax / 127, q = round(x / d));
    BF16  the FP8 weights dequantized exactly (e4m3 * fp32 scale, rounded to bf16).

Norms are F32. Q and K rows are permuted from the half-split RoPE layout (HF) to the
interleaved one llama.cpp's ``mistral3`` architecture expects (convert_hf_to_gguf's
``LlamaModel.permute``), so both engines compute the same model. The vocabulary is a
placeholder SentencePiece table of the right size (the benchmark passes token ids, never
text). A file is reused when its ``fp8serve.source`` key matches the checkpoint's
fingerprint (file names, sizes, mtimes)."""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engine.config import ModelConfig
from engine.kernels.base import Fp8Weight, ScaleKind
from engine.kernels.reference import dequantize
from engine.weights import ModelWeights

ARCH = "mistral3"
QTYPES = ("Q8_0", "BF16")
Q8_BLOCK = 32
SOURCE_KEY = "fp8serve.source"
ROW_CHUNK = 8192  # rows converted at a time (bounds the fp32 temporaries)
Log = Callable[[str], object]
Fetch = Callable[[], "torch.Tensor | Fp8Weight"]


def gguf_path(model_dir: Path, qtype: str) -> Path:
    """Where the ``qtype`` export of ``model_dir`` is cached: a sibling file."""
    if qtype not in QTYPES:
        raise ValueError(f"GGUF type {qtype!r}: choose from {list(QTYPES)}")
    model_dir = Path(model_dir).resolve()
    return model_dir.with_name(f"{model_dir.name}.{qtype}.gguf")


def fingerprint(model_dir: Path) -> str:
    """blake2b of (name, size, mtime_ns) of every file in the checkpoint directory."""
    h = hashlib.blake2b(digest_size=16)
    for p in sorted(Path(model_dir).iterdir()):
        if p.is_file():
            st = p.stat()
            h.update(f"{p.name}\0{st.st_size}\0{st.st_mtime_ns}\n".encode())
    return h.hexdigest()


def cached_source(path: Path) -> str | None:
    """The ``fp8serve.source`` fingerprint stored in a GGUF (None if absent/unreadable)."""
    from gguf import GGUFReader

    try:
        field = GGUFReader(path).get_field(SOURCE_KEY)
    except (OSError, ValueError):
        return None
    return None if field is None else bytes(field.parts[field.data[0]]).decode()


def quantize_q8_0(x: torch.Tensor) -> torch.Tensor:
    """x [N, K] float (K % 32 == 0) -> uint8 [N, K / 32 * 34]: per block of 32 an fp16
    d = amax / 127 then 32 int8 q = round-half-away(x / d) (ggml's reference quantizer)."""
    n, k = x.shape
    if k % Q8_BLOCK:
        raise ValueError(f"Q8_0 needs K % {Q8_BLOCK} == 0, got K = {k}")
    b = x.float().reshape(n, k // Q8_BLOCK, Q8_BLOCK)
    d = b.abs().amax(-1, keepdim=True) / 127.0
    inv = torch.where(d > 0, 1.0 / d, torch.zeros_like(d))
    v = b * inv
    q = torch.trunc(v + 0.5 * torch.sign(v)).clamp_(-127, 127).to(torch.int8)
    dh = d.to(torch.float16).view(torch.uint8)  # [n, k/32, 2], little-endian
    return torch.cat([dh, q.view(torch.uint8)], -1).reshape(n, k // Q8_BLOCK * 34)


def encode(w: torch.Tensor | Fp8Weight, qtype: str) -> np.ndarray:
    """A [N, K] weight (bf16 tensor or Fp8Weight) -> the GGUF bytes of ``qtype`` (uint8
    [N, K/32*34] for Q8_0, uint16 [N, K] bf16 bits for BF16), ROW_CHUNK rows at a time."""
    n = w.n if isinstance(w, Fp8Weight) else int(w.shape[0])
    parts = []
    for a in range(0, n, ROW_CHUNK):
        rows = _rows_fp32(w, a, min(n, a + ROW_CHUNK))
        if qtype == "Q8_0":
            parts.append(quantize_q8_0(rows))
        else:
            parts.append(rows.to(torch.bfloat16).view(torch.int16))
    out = torch.cat(parts)
    return out.numpy() if qtype == "Q8_0" else out.numpy().view(np.uint16)


def _rows_fp32(w: torch.Tensor | Fp8Weight, a: int, b: int) -> torch.Tensor:
    """Rows [a, b) of the weight in fp32 (an Fp8Weight dequantized with its scales)."""
    if not isinstance(w, Fp8Weight):
        return w[a:b].float()
    if w.scale_kind is ScaleKind.PER_TENSOR:
        return w.weight[a:b].float() * w.scale
    if w.scale_kind is ScaleKind.PER_CHANNEL:
        return w.weight[a:b].float() * w.scale[a:b, None]
    return dequantize(w)[a:b]  # 128x128 blocks: the oracle on the whole matrix


def permute_rope(w: torch.Tensor, n_head: int) -> torch.Tensor:
    """[n_head * D, K] rows from half-split RoPE order to interleaved pairs (per head:
    rows (0, D/2, 1, D/2 + 1, ...)); convert_hf_to_gguf's LlamaModel.permute."""
    rows = w.shape[0]
    return (w.reshape(n_head, 2, rows // n_head // 2, *w.shape[1:]).swapaxes(1, 2)
            .reshape(w.shape))


def _permuted(w: torch.Tensor | Fp8Weight, n_head: int) -> torch.Tensor:
    """The fp32 [N, K] weight with its rows permuted for llama.cpp's RoPE."""
    dense = dequantize(w) if isinstance(w, Fp8Weight) else w.float()
    return permute_rope(dense, n_head)


def _entry(name: str, w: torch.Tensor | Fp8Weight, matrix: bool = True,
           rope_heads: int = 0) -> tuple[str, tuple[int, ...], bool, Fetch]:
    shape = (w.n, w.k) if isinstance(w, Fp8Weight) else tuple(w.shape)
    fetch = (lambda: _permuted(w, rope_heads)) if rope_heads else (lambda: w)
    return name, shape, matrix, fetch


def tensors(weights: ModelWeights) -> Iterator[tuple[str, tuple[int, ...], bool, Fetch]]:
    """(GGUF name, numpy-order shape [N, K] or [H], is_matrix, fetch) in file order; the
    tied lm_head is not repeated (llama.cpp then reads token_embd as the output)."""
    c = weights.config
    yield _entry("token_embd.weight", weights.embed_tokens)
    for i, lw in enumerate(weights.layers):
        p = f"blk.{i}."
        yield _entry(p + "attn_norm.weight", lw.input_layernorm, matrix=False)
        yield _entry(p + "attn_q.weight", lw.q_proj, rope_heads=c.num_heads)
        yield _entry(p + "attn_k.weight", lw.k_proj, rope_heads=c.num_kv_heads)
        yield _entry(p + "attn_v.weight", lw.v_proj)
        yield _entry(p + "attn_output.weight", lw.o_proj)
        yield _entry(p + "ffn_norm.weight", lw.post_attention_layernorm, matrix=False)
        yield _entry(p + "ffn_gate.weight", lw.gate_proj)
        yield _entry(p + "ffn_up.weight", lw.up_proj)
        yield _entry(p + "ffn_down.weight", lw.down_proj)
    yield _entry("output_norm.weight", weights.norm, matrix=False)
    if weights.lm_head is not None:
        yield _entry("output.weight", weights.lm_head)


def _nbytes(shape: tuple[int, ...], matrix: bool, qtype: str) -> int:
    if not matrix:
        return 4 * shape[0]
    n, k = shape
    return n * k // Q8_BLOCK * 34 if qtype == "Q8_0" else 2 * n * k


def _add_metadata(w: Any, cfg: ModelConfig, qtype: str, name: str, source: str) -> None:
    """Hyper-parameters as convert_hf_to_gguf writes them for Ministral-3 (mistral3)."""
    import gguf

    w.add_name(name)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_Q8_0 if qtype == "Q8_0"
                    else gguf.LlamaFileType.MOSTLY_BF16)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_block_count(cfg.num_layers)
    w.add_head_count(cfg.num_heads)
    w.add_head_count_kv(cfg.num_kv_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_dimension_count(cfg.head_dim)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    r = cfg.rope
    w.add_rope_freq_base(r.theta)
    if r.rope_type == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(r.factor)
        w.add_rope_scaling_orig_ctx_len(r.original_max_position_embeddings)
        w.add_rope_scaling_yarn_beta_fast(r.beta_fast)
        w.add_rope_scaling_yarn_beta_slow(r.beta_slow)
        w.add_rope_scaling_yarn_log_mul(r.mscale_all_dim)
    if r.llama_4_scaling_beta:
        w.add_float32(f"{ARCH}.attention.temperature_scale", r.llama_4_scaling_beta)
    w.add_string(SOURCE_KEY, source)


def _add_vocab(w: Any, cfg: ModelConfig) -> None:
    """A placeholder SentencePiece vocabulary of ``vocab_size`` entries: <unk> <s> </s>,
    the 256 byte tokens, then unique dummies (the benchmark never tokenizes text)."""
    import gguf

    v = cfg.vocab_size
    toks = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    types += [gguf.TokenType.BYTE] * 256
    toks += [f"\u2581t{i}" for i in range(len(toks), v)]
    types += [gguf.TokenType.NORMAL] * (v - len(types))
    w.add_tokenizer_model("llama")
    w.add_token_list(toks[:v])
    w.add_token_scores([0.0] * v)
    w.add_token_types(types[:v])
    w.add_unk_token_id(0)
    w.add_bos_token_id(cfg.bos_token_id if cfg.bos_token_id is not None else 1)
    w.add_eos_token_id(cfg.eos_token_ids[0] if cfg.eos_token_ids else 2)
    w.add_add_bos_token(False)


def _encoded(fetch: Fetch, matrix: bool, qtype: str) -> np.ndarray:
    x = fetch()
    if not matrix:
        assert isinstance(x, torch.Tensor)
        return x.float().numpy()
    return encode(x, qtype)


def write_gguf(weights: ModelWeights, out: Path, qtype: str, name: str, source: str,
               log: Log = print) -> None:
    """Stream ``weights`` into a GGUF at ``out`` (one tensor in memory at a time)."""
    import gguf

    w = gguf.GGUFWriter(out, ARCH)
    _add_metadata(w, weights.config, qtype, name, source)
    _add_vocab(w, weights.config)
    raw = gguf.GGMLQuantizationType.Q8_0 if qtype == "Q8_0" else gguf.GGMLQuantizationType.BF16
    entries = list(tensors(weights))
    for tname, shape, matrix, _ in entries:
        if not matrix:
            w.add_tensor_info(tname, shape, np.dtype(np.float32), 4 * shape[0])
            continue
        nb = _nbytes(shape, True, qtype)
        byte_shape = (shape[0], nb // shape[0]) if qtype == "Q8_0" else shape
        dtype = np.dtype(np.uint8) if qtype == "Q8_0" else np.dtype(np.uint16)
        w.add_tensor_info(tname, byte_shape, dtype, nb, raw_dtype=raw)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    for i, (tname, _, matrix, fetch) in enumerate(entries):
        w.write_tensor_data(_encoded(fetch, matrix, qtype))
        if i % 45 == 0:
            log(f"gguf {qtype}: {i + 1}/{len(entries)} tensors ({tname})")
    w.close()


def ensure_gguf(model_dir: Path, qtype: str, log: Log = print) -> Path:
    """The cached ``qtype`` GGUF of ``model_dir``, exported first when missing or stale."""
    from engine.loader import load_weights

    out, source = gguf_path(model_dir, qtype), fingerprint(model_dir)
    if out.is_file() and cached_source(out) == source:
        return out
    log(f"exporting {model_dir} to {out}")
    weights = load_weights(Path(model_dir), progress=False)
    tmp = out.with_name(out.name + f".tmp{os.getpid()}")
    try:
        write_gguf(weights, tmp, qtype, Path(model_dir).resolve().name, source, log)
        os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    return out
