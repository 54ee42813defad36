"""VisionConfig from both layouts, and the vision part of `fp8serve synth-model`: the
published Pixtral shapes and the tokenizer's image tokens."""

from __future__ import annotations

import json

import pytest

from engine.checkpoint.errors import CheckpointError
from engine.synth import SynthSpec, tensor_plan
from engine.synth.vision import PIXTRAL_VISION
from engine.vision.config import VisionConfig, read_vision_config
from tests.engine.vision.support import write_pair


def test_both_layouts_parse_to_the_same_config(tmp_path) -> None:
    hf, native = write_pair(tmp_path)
    a, b = read_vision_config(hf), read_vision_config(native)
    assert a == b
    assert (a.hidden_size, a.num_heads, a.head_dim, a.patch_size) == (64, 4, 16, 14)
    assert (a.image_size, a.max_patches_per_side, a.token_pixels) == (112, 8, 28)
    assert a.text_hidden_size == 256 and a.image_token_id == 10


def test_published_shapes_in_the_3b_plan() -> None:
    plan = {t.entry.name: t.entry.shape for t in tensor_plan(SynthSpec.preset("ministral-3-3b"))}
    assert plan["vision_tower.patch_conv.weight"] == (1024, 3, 14, 14)
    assert plan["vision_tower.transformer.layers.23.attention.q_proj.weight"] == (1024, 1024)
    assert plan["vision_tower.transformer.layers.23.feed_forward.gate_proj.weight"] == (
        4096, 1024)
    assert "vision_tower.transformer.layers.24.ffn_norm.weight" not in plan
    assert plan["multi_modal_projector.patch_merger.merging_layer.weight"] == (1024, 4096)
    assert plan["multi_modal_projector.linear_1.weight"] == (3072, 1024)
    assert plan["multi_modal_projector.linear_2.weight"] == (3072, 3072)
    assert PIXTRAL_VISION.image_size // PIXTRAL_VISION.patch_size == 110


def test_native_plan_uses_native_names() -> None:
    spec = SynthSpec.preset("tiny", layout="native", native_vision=True)
    names = {t.entry.name for t in tensor_plan(spec)}
    assert {"vision_encoder.transformer.layers.0.attention.wq.weight",
            "vision_encoder.transformer.layers.0.feed_forward.w3.weight",
            "pre_mm_projector_norm.weight", "patch_merger.merging_layer.weight",
            "vision_language_adapter.w_in.weight"} <= names
    assert not any(n.startswith("vision_tower.") for n in names)


def test_tokenizer_has_the_image_tokens_and_config(tmp_path) -> None:
    from mistral_common.tokens.tokenizers.tekken import Tekkenizer

    hf, _ = write_pair(tmp_path)
    tok = Tekkenizer.from_file(str(hf / "tekken.json"))
    ids = [tok.get_special_token(t) for t in ("[IMG]", "[IMG_BREAK]", "[IMG_END]")]
    assert ids == [10, 12, 13]
    image = json.loads((hf / "tekken.json").read_text())["image"]
    assert image == {"image_patch_size": 14, "max_image_size": 112, "spatial_merge_size": 2}


def test_bad_vision_configs_are_refused(tmp_path) -> None:
    hf, native = write_pair(tmp_path)
    cfg = json.loads((hf / "config.json").read_text())
    cfg["projector_hidden_act"] = "relu"
    (hf / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="projector_hidden_act 'relu' unsupported"):
        read_vision_config(hf)
    p = json.loads((native / "params.json").read_text())
    del p["vision_encoder"]["hidden_size"]
    (native / "params.json").write_text(json.dumps(p))
    with pytest.raises(CheckpointError, match="params.json: missing field.*hidden_size"):
        read_vision_config(native)
    with pytest.raises(ValueError, match="multiple of 4"):
        VisionConfig(hidden_size=36, intermediate_size=8, num_layers=1, num_heads=6,
                     patch_size=14, image_size=56, text_hidden_size=8)


def test_synth_model_cli_native_vision(tmp_path) -> None:
    import argparse

    import cli.synth_model

    parser = argparse.ArgumentParser(prog="fp8serve")
    cli.synth_model.register(parser.add_subparsers())
    args = parser.parse_args(["synth-model", "--shape", "tiny", "--layout", "native",
                              "--native-vision", "--out", str(tmp_path)])
    assert args.func(args) == 0
    cfg = read_vision_config(tmp_path)
    assert cfg is not None and cfg.num_layers == 1 and cfg.image_size == 56
