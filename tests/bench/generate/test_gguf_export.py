"""GGUF export for the llama.cpp baseline (bench/generate/gguf_export.py): Q8_0 bytes equal
gguf-py's reference quantizer, BF16 equals the dequantized FP8 weights, Q/K rows are in
llama.cpp's interleaved RoPE order, the metadata is the model's, the cache is reused until
the checkpoint changes, and llama.cpp (llama-cpp-python, which `make test` installs) on the
BF16 export computes the same next-token distribution as fp8serve."""

from __future__ import annotations

import shutil

import gguf
import numpy as np
import pytest
import torch

from bench.generate.gguf_export import (
    ensure_gguf,
    gguf_path,
    permute_rope,
    quantize_q8_0,
)
from engine.kernels.reference import dequantize
from engine.loader import load_weights


@pytest.fixture(scope="module")
def ckpt(tiny_checkpoint, tmp_path_factory):
    """A private copy (the export writes a sibling file next to it)."""
    dst = tmp_path_factory.mktemp("gguf") / "tiny"
    shutil.copytree(tiny_checkpoint(), dst)
    return dst


def _tensor(reader, name):
    return next(t for t in reader.tensors if t.name == name)


def test_q8_0_matches_gguf_reference_quantizer() -> None:
    x = torch.randn(48, 256, generator=torch.Generator().manual_seed(0)) * 3
    x[0, :32] = 0  # an all-zero block: d = 0, q = 0
    want = gguf.quants.quantize(x.numpy(), gguf.GGMLQuantizationType.Q8_0)
    assert np.array_equal(quantize_q8_0(x).numpy(), want)
    with pytest.raises(ValueError, match="K % 32"):
        quantize_q8_0(torch.zeros(2, 48))


def test_permute_rope_interleaves_each_head() -> None:
    heads, d = 2, 8
    w = torch.arange(heads * d, dtype=torch.float32)[:, None].repeat(1, 3)
    got = permute_rope(w, heads)[:, 0].long().tolist()
    assert got == [0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15]


def test_bf16_export_holds_the_dequantized_weights(ckpt) -> None:
    path = ensure_gguf(ckpt, "BF16", log=lambda s: None)
    assert path == gguf_path(ckpt, "BF16") and path.parent == ckpt.parent
    r = gguf.GGUFReader(path)
    w = load_weights(ckpt, progress=False)
    c = w.config
    assert len(r.tensors) == 2 + 9 * c.num_layers + (w.lm_head is not None)

    def bf16(name):
        t = _tensor(r, name)
        assert t.tensor_type == gguf.GGMLQuantizationType.BF16
        return torch.from_numpy(np.array(t.data)).view(torch.bfloat16).reshape(
            int(t.shape[1]), int(t.shape[0]))

    lw = w.layers[1]
    assert torch.equal(bf16("blk.1.ffn_down.weight"), dequantize(lw.down_proj).bfloat16())
    q = permute_rope(dequantize(lw.q_proj), c.num_heads).bfloat16()
    assert torch.equal(bf16("blk.1.attn_q.weight"), q)
    k = permute_rope(dequantize(lw.k_proj), c.num_kv_heads).bfloat16()
    assert torch.equal(bf16("blk.1.attn_k.weight"), k)
    assert torch.equal(bf16("token_embd.weight"), w.embed_tokens)
    norm = np.array(_tensor(r, "output_norm.weight").data)
    assert np.array_equal(norm, w.norm.float().numpy())
    meta = {f.name: f for f in r.fields.values()}
    assert int(meta["mistral3.block_count"].parts[-1][0]) == c.num_layers
    assert int(meta["mistral3.attention.head_count_kv"].parts[-1][0]) == c.num_kv_heads
    assert int(meta["mistral3.attention.key_length"].parts[-1][0]) == c.head_dim
    assert float(meta["mistral3.attention.temperature_scale"].parts[-1][0]) == \
        pytest.approx(c.rope.llama_4_scaling_beta)
    assert len(meta["tokenizer.ggml.tokens"].data) == c.vocab_size


def test_q8_0_export_sizes_and_cache(ckpt) -> None:
    path = ensure_gguf(ckpt, "Q8_0", log=lambda s: None)
    r = gguf.GGUFReader(path)
    w = load_weights(ckpt, progress=False)
    t = _tensor(r, "blk.0.ffn_up.weight")
    assert t.tensor_type == gguf.GGMLQuantizationType.Q8_0
    assert int(t.n_bytes) == w.config.intermediate_size * w.config.hidden_size // 32 * 34
    got = gguf.quants.dequantize(np.array(t.data), gguf.GGMLQuantizationType.Q8_0)
    ref = dequantize(w.layers[0].up_proj).numpy()
    assert np.abs(got - ref).max() <= np.abs(ref).max() / 127  # within one Q8_0 step
    mtime = path.stat().st_mtime_ns
    assert ensure_gguf(ckpt, "Q8_0", log=lambda s: None) == path
    assert path.stat().st_mtime_ns == mtime  # reused
    (ckpt / "generation_config.json").write_text('{"bos_token_id": 1}')
    ensure_gguf(ckpt, "Q8_0", log=lambda s: None)
    assert path.stat().st_mtime_ns != mtime  # the checkpoint changed: exported again
    with pytest.raises(ValueError, match="GGUF type"):
        gguf_path(ckpt, "Q4_0")


def test_llamacpp_on_bf16_export_matches_fp8serve(ckpt) -> None:
    import llama_cpp  # llama-cpp-python: installed by `make test` (Makefile llamacpp-ref)

    from bench.generate.run import GenerateBenchConfig, load_bench_runner
    from engine.batch import BatchInputs, SeqChunk

    path = ensure_gguf(ckpt, "BF16", log=lambda s: None)
    prompt = [1] + list(range(300, 340))
    runner, _, _ = load_bench_runner(GenerateBenchConfig(ckpt, prompt_len=41, gen_len=2))
    blocks = tuple(range(-(-len(prompt) // runner.block_size) + 1))
    ours = runner.run(BatchInputs((SeqChunk(0, tuple(prompt), 0, blocks),)))[0].float()
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=128, n_threads=1, verbose=False,
                          logits_all=False)
    llm.eval(prompt)
    last = llama_cpp.llama_get_logits_ith(llm.ctx, -1)  # the last prompt row's logits
    theirs = torch.from_numpy(np.ctypeslib.as_array(last, shape=(llm.n_vocab(),)).copy())
    p, q = ours.log_softmax(-1), theirs.log_softmax(-1)
    kl = float((p.exp() * (p - q)).sum())
    assert int(ours.argmax()) == int(theirs.argmax())
    assert kl < 1e-2, kl
