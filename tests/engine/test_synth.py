"""engine.synth / `fp8serve synth-model`: published shapes, determinism, valid FP8 codes."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

import cli.synth_model
from engine.loader import load_weights, read_model_config
from engine.synth import SynthSpec, tensor_plan, write_checkpoint
from engine.synth.tensors import FP8


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fp8serve")
    cli.synth_model.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.mark.parametrize("shape,hidden,inter,layers,tied,gib", [
    ("ministral-3-3b", 3072, 9216, 26, True, (4.0, 5.0)),
    ("ministral-3-8b", 4096, 14336, 34, False, (9.0, 10.5)),
])
def test_preset_plans_have_published_shapes(shape, hidden, inter, layers, tied, gib):
    spec = SynthSpec.preset(shape)
    assert (spec.hidden_size, spec.intermediate_size, spec.num_layers) == (hidden, inter, layers)
    heads = (spec.num_heads, spec.num_kv_heads, spec.head_dim, spec.vocab_size)
    assert heads == (32, 8, 128, 131072)
    assert spec.tie_word_embeddings is tied and spec.layout == "hf-multimodal" and spec.tokenizer
    plan = {t.entry.name: t.entry for t in tensor_plan(spec)}
    q = plan["language_model.model.layers.0.self_attn.q_proj.weight"]
    assert (q.dtype, q.shape) == (FP8, (4096, hidden))
    down = plan[f"language_model.model.layers.{layers - 1}.mlp.down_proj.weight"]
    assert down.shape == (hidden, inter)
    assert plan["language_model.model.layers.0.self_attn.k_proj.weight_scale_inv"].shape == ()
    assert ("language_model.lm_head.weight" in plan) is not tied
    assert any(n.startswith("vision_tower.transformer.layers.23.") for n in plan)
    total = sum(e.nbytes for e in plan.values()) / 2**30
    assert gib[0] < total < gib[1]


def test_cli_8b_two_layers(tmp_path, capsys):
    out = tmp_path / "m8b"
    assert _cli(["synth-model", "--shape", "ministral-3-8b", "--layers", "2", "--out", str(out),
                 "--layout", "hf-text", "--no-tokenizer"]) == 0
    printed = capsys.readouterr().out
    assert "model.safetensors" in printed and "GiB" in printed and str(out) in printed
    cfg = read_model_config(out)
    assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_layers) == (4096, 14336, 2)
    assert (cfg.num_heads, cfg.num_kv_heads, cfg.head_dim, cfg.vocab_size) == (32, 8, 128, 131072)
    assert cfg.rope.original_max_position_embeddings == 16384 and not cfg.tie_word_embeddings
    w = load_weights(out, progress=False)
    assert w.layers[1].gate_proj.weight.shape == (14336, 4096)
    assert w.layers[1].gate_proj.weight.dtype == FP8
    assert w.lm_head.shape == (131072, 4096) and w.lm_head.dtype == torch.bfloat16


def test_cli_rejects_bad_combination(tmp_path):
    from cli.main import CliError

    with pytest.raises(CliError, match="native layout stores per-tensor FP8 only"):
        _cli(["synth-model", "--shape", "tiny", "--out", str(tmp_path), "--layout", "native",
              "--quant", "fp8-block"])


def test_same_seed_same_bytes_other_seed_differs(tmp_path):
    files = []
    for name, seed in (("a", 1), ("b", 1), ("c", 2)):
        write_checkpoint(tmp_path / name, SynthSpec.preset("tiny", seed=seed))
        files.append((tmp_path / name / "model.safetensors").read_bytes())
    assert files[0] == files[1] and files[0] != files[2]


def test_fp8_codes_never_nan_and_spread(tiny_checkpoint):
    w = load_weights(tiny_checkpoint(), progress=False)
    codes = torch.cat([getattr(layer, n).weight.view(torch.uint8).flatten()
                       for layer in w.layers for n in ("q_proj", "down_proj")])
    assert not ((codes & 0x7F) == 0x7F).any()  # 0x7F / 0xFF are e4m3fn NaN
    assert torch.isfinite(w.layers[0].q_proj.weight.float()).all()
    assert len(torch.unique(codes)) > 150  # codes cover most of the format


def test_side_files_and_tokenizer(tmp_path):
    res = write_checkpoint(tmp_path, SynthSpec.preset("tiny", tokenizer=True))
    assert set(res.files) == {"model.safetensors", "config.json", "generation_config.json",
                              "tekken.json"}
    assert res.nbytes == sum((tmp_path / f).stat().st_size for f in res.files)
    gen = json.loads((tmp_path / "generation_config.json").read_text())
    assert (gen["bos_token_id"], gen["eos_token_id"], gen["pad_token_id"]) == (1, 2, 11)
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    tok = Tekkenizer.from_file(str(tmp_path / "tekken.json"))
    assert tok.n_words == 1024 and tok.version.value == "v13"  # the model's own vocab_size


def test_sharded_index(tmp_path):
    res = write_checkpoint(tmp_path, SynthSpec.preset("tiny", shard_bytes=300_000))
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    shards = sorted(set(index["weight_map"].values()))
    assert len(shards) > 2 and all(s in res.files for s in shards)
    assert shards[0] == f"model-00001-of-{len(shards):05d}.safetensors"


def test_spec_validation():
    with pytest.raises(ValueError, match="layout"):
        SynthSpec(layout="gguf")
    with pytest.raises(ValueError, match="num_kv_heads"):
        SynthSpec(num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="unknown shape"):
        SynthSpec.preset("ministral-3-14b")


def test_smollm2_preset_has_the_demo_models_shapes(tmp_path):
    """--shape smollm2-135m: the demo model's config and linear shapes, random weights (its
    decode work without its GGUF)."""
    from engine.demo_model import ensure_demo_model

    demo_dir = ensure_demo_model()
    out = tmp_path / "s"
    assert _cli(["synth-model", "--shape", "smollm2-135m", "--out", str(out),
                 "--no-tokenizer"]) == 0
    cfg, demo = read_model_config(out), read_model_config(demo_dir)
    for f in ("architecture", "hidden_size", "intermediate_size", "num_layers", "num_heads",
              "num_kv_heads", "head_dim", "vocab_size", "tie_word_embeddings",
              "max_position_embeddings", "rope"):
        assert getattr(cfg, f) == getattr(demo, f), f
    assert (cfg.quant.method, cfg.quant.scale_kind) == (demo.quant.method, demo.quant.scale_kind)
    ws, wd = load_weights(out, progress=False), load_weights(demo_dir, progress=False)
    for i in (0, demo.num_layers - 1):
        for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                     "down_proj"):
            a, b = getattr(ws.layers[i], name).weight, getattr(wd.layers[i], name).weight
            assert (a.shape, a.dtype) == (b.shape, b.dtype), (i, name)
