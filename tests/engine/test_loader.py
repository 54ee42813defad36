"""Loader: every layout of the same random model loads to the same canonical tensors."""

from __future__ import annotations

import json

import pytest
import torch

from engine.checkpoint.assemble import interleaved_to_half_split
from engine.kernels.base import FP8_DTYPE, Fp8Weight, ScaleKind
from engine.loader import load_weights, read_model_config
from engine.weights import LINEAR_NAMES, ModelWeights


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8) if t.dtype == FP8_DTYPE else t


def assert_same_weights(a: ModelWeights, b: ModelWeights) -> None:
    assert torch.equal(a.embed_tokens, b.embed_tokens)
    assert torch.equal(a.norm, b.norm)
    assert (a.lm_head is None) == (b.lm_head is None)
    if a.lm_head is not None:
        assert torch.equal(a.lm_head, b.lm_head)
    assert len(a.layers) == len(b.layers)
    for la, lb in zip(a.layers, b.layers, strict=True):
        assert torch.equal(la.input_layernorm, lb.input_layernorm)
        assert torch.equal(la.post_attention_layernorm, lb.post_attention_layernorm)
        for name in LINEAR_NAMES:
            wa, wb = getattr(la, name), getattr(lb, name)
            assert type(wa) is type(wb), name
            if isinstance(wa, Fp8Weight):
                assert torch.equal(_bits(wa.weight), _bits(wb.weight)), name
                assert torch.equal(wa.scale, wb.scale), name
                assert wa.scale_kind is wb.scale_kind
                assert (wa.activation_scale is None) == (wb.activation_scale is None)
                if wa.activation_scale is not None:
                    assert torch.equal(wa.activation_scale, wb.activation_scale)
            else:
                assert torch.equal(wa, wb), name


@pytest.mark.parametrize("layout,extra", [
    ("hf-multimodal", {}),
    ("hf-multimodal", {"mm_prefix": "model.language_model."}),
    ("native", {}),
    ("hf-text", {"shard_bytes": 150_000}),
])
def test_layouts_load_identical_tensors(tiny_checkpoint, layout, extra):
    ref = load_weights(tiny_checkpoint(seed=7), progress=False)
    other = load_weights(tiny_checkpoint(layout=layout, seed=7, **extra), progress=False)
    assert_same_weights(ref, other)


def test_canonical_layout_fp8_per_tensor(tiny_checkpoint):
    w = load_weights(tiny_checkpoint(), progress=False)
    cfg = w.config
    assert w.embed_tokens.shape == (cfg.vocab_size, cfg.hidden_size)
    assert w.embed_tokens.dtype == torch.bfloat16 and w.norm.dtype == torch.bfloat16
    assert isinstance(w.lm_head, torch.Tensor) and w.lm_head.dtype == torch.bfloat16
    layer = w.layers[0]
    shapes = {"q_proj": (256, 256), "k_proj": (128, 256), "v_proj": (128, 256),
              "o_proj": (256, 256), "gate_proj": (512, 256), "up_proj": (512, 256),
              "down_proj": (256, 512)}
    for name, shape in shapes.items():
        lin = getattr(layer, name)
        lin.validate(name)
        assert lin.scale_kind is ScaleKind.PER_TENSOR and tuple(lin.weight.shape) == shape
        assert lin.scale.dtype == torch.float32 and lin.scale.dim() == 0 and lin.scale > 0
        assert lin.activation_scale is not None and lin.activation_scale > 0
    # std of the dequantized weight ~ 1/sqrt(K): activations stay in a sane range
    std = (layer.down_proj.weight.float() * layer.down_proj.scale).std().item()
    assert 0.5 / 512**0.5 < std < 2.0 / 512**0.5


def test_fp8_block_scales(tiny_checkpoint):
    w = load_weights(tiny_checkpoint(quant="fp8-block", scale_dtype="fp32"), progress=False)
    down = w.layers[1].down_proj
    down.validate("down_proj")
    assert down.scale_kind is ScaleKind.BLOCK and tuple(down.scale.shape) == (2, 4)
    assert down.activation_scale is None and w.config.quant.activation_scheme == "dynamic"
    # the same fp8 codes as the per-tensor checkpoint of that seed
    pt = load_weights(tiny_checkpoint(), progress=False).layers[1].down_proj
    assert torch.equal(_bits(down.weight), _bits(pt.weight))


def test_bf16_checkpoint(tiny_checkpoint):
    w = load_weights(tiny_checkpoint(quant="bf16"), progress=False)
    assert w.config.quant.method == "none"
    q = w.layers[0].q_proj
    assert isinstance(q, torch.Tensor) and q.dtype == torch.bfloat16 and q.shape == (256, 256)
    native = load_weights(tiny_checkpoint(quant="bf16", layout="native"), progress=False)
    assert_same_weights(w, native)


def test_tied_embeddings(tiny_checkpoint):
    for layout in ("hf-text", "hf-multimodal", "native"):
        w = load_weights(tiny_checkpoint(layout=layout, tie_word_embeddings=True), progress=False)
        assert w.config.tie_word_embeddings and w.lm_head is None


def test_native_permutation_matches_definition():
    n_heads, hd, k = 2, 8, 3
    half = torch.arange(n_heads * hd * k, dtype=torch.float32).view(n_heads * hd, k)
    # interleaved row 2j / 2j+1 of each head = half-split row j / j + hd/2
    inter = torch.empty_like(half)
    for h in range(n_heads):
        for j in range(hd // 2):
            inter[h * hd + 2 * j] = half[h * hd + j]
            inter[h * hd + 2 * j + 1] = half[h * hd + j + hd // 2]
    assert torch.equal(interleaved_to_half_split(inter, n_heads), half)


def test_native_rows_really_interleaved_on_disk(tiny_checkpoint):
    from safetensors import safe_open

    d = tiny_checkpoint(layout="native")
    with safe_open(str(d / "consolidated.safetensors"), "pt") as f:
        disk = f.get_tensor("layers.0.attention.wk.weight")
    loaded = load_weights(d, progress=False).layers[0].k_proj.weight
    assert not torch.equal(_bits(disk), _bits(loaded))
    assert torch.equal(_bits(interleaved_to_half_split(disk, 2)), _bits(loaded))


def test_config_yarn_and_llama4(tiny_checkpoint):
    for layout in ("hf-text", "hf-multimodal", "native"):
        cfg = read_model_config(tiny_checkpoint(layout=layout))
        r = cfg.rope
        assert (r.rope_type, r.theta, r.factor) == ("yarn", 1e6, 16.0), layout
        assert r.original_max_position_embeddings == 32
        assert (r.beta_fast, r.beta_slow, r.mscale, r.mscale_all_dim) == (32.0, 1.0, 1.0, 1.0)
        assert r.llama_4_scaling_beta == pytest.approx(0.1)
        assert cfg.bos_token_id == 1 and cfg.eos_token_ids == (2,)
        assert cfg.has_vision == (layout == "hf-multimodal")


def test_config_default_rope_and_legacy_rope_scaling(tiny_checkpoint, tmp_path):
    cfg = read_model_config(tiny_checkpoint(rope="default", llama_4_scaling_beta=0.0))
    assert cfg.rope.rope_type == "default" and cfg.rope.llama_4_scaling_beta == 0.0
    (tmp_path / "model.safetensors").touch()
    legacy = {"architectures": ["MistralForCausalLM"], "model_type": "mistral",
              "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 1,
              "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 100,
              "rope_theta": 5e5, "max_position_embeddings": 8192,
              "rope_scaling": {"type": "yarn", "factor": 4.0,
                               "original_max_position_embeddings": 2048}}
    (tmp_path / "config.json").write_text(json.dumps(legacy))
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 7]}))
    cfg = read_model_config(tmp_path)
    assert cfg.head_dim == 16 and cfg.quant.method == "none"
    assert (cfg.rope.rope_type, cfg.rope.theta, cfg.rope.factor) == ("yarn", 5e5, 4.0)
    assert cfg.rope.original_max_position_embeddings == 2048
    assert cfg.eos_token_ids == (2, 7)


def test_vision_tensors_counted_not_read(tiny_checkpoint, monkeypatch, caplog):
    from engine.checkpoint.tensors import TensorStore

    read: list[str] = []
    orig = TensorStore.get
    monkeypatch.setattr(TensorStore, "get", lambda self, n: (read.append(n), orig(self, n))[1])
    with caplog.at_level("INFO"):
        load_weights(tiny_checkpoint(layout="hf-multimodal"), progress=False)
    assert read and not [n for n in read if "vision" in n or "projector" in n]
    assert "15 vision tensors" in caplog.text


def test_progress_bar_goes_to_stderr(tiny_checkpoint, capsys):
    load_weights(tiny_checkpoint(), progress=True)
    out, err = capsys.readouterr()
    assert out == "" and "loading weights" in err



def test_modules_to_not_convert_text_linear(tiny_checkpoint, tmp_path):
    import shutil

    from safetensors.torch import load_file, save_file

    d = tmp_path / "c"
    shutil.copytree(tiny_checkpoint(), d)
    fp8 = load_weights(d, progress=False).layers[0].down_proj
    tensors = load_file(str(d / "model.safetensors"))
    base = "model.layers.0.mlp.down_proj."
    tensors[base + "weight"] = (fp8.weight.float() * fp8.scale).to(torch.bfloat16)
    del tensors[base + "weight_scale_inv"], tensors[base + "activation_scale"]
    save_file(tensors, str(d / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"]["modules_to_not_convert"].append("model.layers.0.mlp.down_proj")
    (d / "config.json").write_text(json.dumps(cfg))
    w = load_weights(d, progress=False)
    down = w.layers[0].down_proj
    assert isinstance(down, torch.Tensor) and down.dtype == torch.bfloat16
    assert torch.equal(down, tensors[base + "weight"])
    assert isinstance(w.layers[1].down_proj, Fp8Weight)


def test_llama_config_plain_rope(tmp_path):
    (tmp_path / "model.safetensors").touch()
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
           "intermediate_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
           "vocab_size": 100, "rope_theta": 100000.0, "tie_word_embeddings": True,
           "eos_token_id": 5, "bos_token_id": 4}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    c = read_model_config(tmp_path)
    assert (c.rope.rope_type, c.rope.theta, c.rope.llama_4_scaling_beta) == ("default", 1e5, 0.0)
    assert c.num_kv_heads == 4 and c.tie_word_embeddings and not c.has_vision
    assert (c.bos_token_id, c.eos_token_ids) == (4, (5,))


def test_absent_fp8_keys_read_as_transformers_reads_them(tiny_checkpoint, tmp_path):
    """quantization_config without weight_block_size and activation_scheme: 128 x 128
    blocks and dynamic activations (FineGrainedFP8Config's defaults), as a block
    checkpoint needs; an explicit null block size stays per-tensor."""
    import shutil
    from pathlib import Path

    src = tiny_checkpoint(quant="fp8-block")
    d = Path(shutil.copytree(src, tmp_path / "block"))
    cfg = json.loads((d / "config.json").read_text())
    q = cfg.get("quantization_config") or cfg["text_config"]["quantization_config"]
    assert q.pop("weight_block_size") == [128, 128] and q.pop("activation_scheme") == "dynamic"
    (d / "config.json").write_text(json.dumps(cfg))
    w = load_weights(d, progress=False)
    assert w.config.quant.scale_kind is ScaleKind.BLOCK and w.config.quant.block_size == (128, 128)
    assert w.config.quant.activation_scheme == "dynamic"
    assert torch.equal(w.layers[1].down_proj.scale,
                       load_weights(src, progress=False).layers[1].down_proj.scale)
