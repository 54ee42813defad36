"""Bad checkpoints fail with one CheckpointError line naming the file and the tensor."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from engine.checkpoint.errors import CheckpointError
from engine.loader import load_weights, read_model_config

Q_SCALE = "model.layers.1.self_attn.q_proj.weight_scale_inv"


def _copy(src: Path, dst: Path) -> Path:
    shutil.copytree(src, dst, dirs_exist_ok=True)
    return dst


def _edit(model_dir: Path, fn, file: str = "model.safetensors") -> None:
    tensors = load_file(str(model_dir / file))
    fn(tensors)
    save_file(tensors, str(model_dir / file), metadata={"format": "pt"})


def _error(model_dir: Path) -> str:
    with pytest.raises(CheckpointError) as info:
        load_weights(model_dir, progress=False)
    msg = str(info.value)
    assert "\n" not in msg
    return msg


@pytest.fixture
def ckpt(tiny_checkpoint, tmp_path) -> Path:
    return _copy(tiny_checkpoint(), tmp_path / "ckpt")


def test_missing_tensor(ckpt):
    _edit(ckpt, lambda t: t.pop(Q_SCALE))
    assert _error(ckpt) == f"model.safetensors: tensor '{Q_SCALE}' missing"


def test_missing_activation_scale_native(tiny_checkpoint, tmp_path):
    d = _copy(tiny_checkpoint(layout="native"), tmp_path / "n")
    _edit(d, lambda t: t.pop("layers.0.feed_forward.w2.qscale_act"), "consolidated.safetensors")
    want = "consolidated.safetensors: tensor 'layers.0.feed_forward.w2.qscale_act' missing"
    assert _error(d) == want


def test_unexpected_tensor(ckpt):
    _edit(ckpt, lambda t: t.update({"model.layers.0.mlp.extra_proj.weight": torch.zeros(2)}))
    msg = _error(ckpt)
    want = "model.safetensors: tensor 'model.layers.0.mlp.extra_proj.weight' unexpected"
    assert msg.startswith(want)


def test_layer_beyond_config_is_unexpected(ckpt):
    _edit(ckpt, lambda t: t.update({"model.layers.2.input_layernorm.weight": torch.ones(256)}))
    assert "tensor 'model.layers.2.input_layernorm.weight' unexpected" in _error(ckpt)


def test_wrong_dtype(ckpt):
    name = "model.layers.0.self_attn.q_proj.weight"
    _edit(ckpt, lambda t: t.update({name: t[name].to(torch.bfloat16)}))
    assert _error(ckpt) == (f"model.safetensors: tensor '{name}': wrong dtype bfloat16, "
                            "expected float8_e4m3fn")


def test_wrong_dtype_norm(ckpt):
    name = "model.norm.weight"
    _edit(ckpt, lambda t: t.update({name: t[name].to(torch.int32)}))
    assert f"model.safetensors: tensor '{name}': wrong dtype int32" in _error(ckpt)


def test_wrong_shape(ckpt):
    name = "model.layers.1.self_attn.k_proj.weight"
    _edit(ckpt, lambda t: t.update({name: t[name][:64].contiguous()}))
    assert _error(ckpt) == (f"model.safetensors: tensor '{name}': wrong shape [64, 256], "
                            "expected [128, 256]")


def test_wrong_block_scale_shape(tiny_checkpoint, tmp_path):
    d = _copy(tiny_checkpoint(quant="fp8-block"), tmp_path / "b")
    name = "model.layers.0.mlp.down_proj.weight_scale_inv"
    _edit(d, lambda t: t.update({name: t[name].t().contiguous()}))
    assert _error(d) == (f"model.safetensors: tensor '{name}': wrong shape [4, 2], "
                         "expected [2, 4]")


@pytest.mark.parametrize("value,problem", [
    (float("nan"), "scale is NaN"), (float("inf"), "scale is inf"),
    (0.0, "scale is <= 0"), (-1.0, "scale is <= 0"),
])
def test_bad_scale_value(ckpt, value, problem):
    _edit(ckpt, lambda t: t.update({Q_SCALE: torch.tensor(value, dtype=torch.bfloat16)}))
    assert _error(ckpt).startswith(f"model.safetensors: tensor '{Q_SCALE}': {problem}")


def test_bad_activation_scale(ckpt):
    name = "model.layers.0.mlp.up_proj.activation_scale"
    _edit(ckpt, lambda t: t.update({name: torch.tensor([-0.5])}))
    assert _error(ckpt).startswith(f"model.safetensors: tensor '{name}': scale is <= 0")


def test_scale_shape_one_accepted_as_scalar(ckpt):
    _edit(ckpt, lambda t: t.update({Q_SCALE: torch.tensor([0.01], dtype=torch.float32)}))
    q = load_weights(ckpt, progress=False).layers[1].q_proj
    assert q.scale.shape == () and q.scale.dtype == torch.float32
    assert q.scale.item() == pytest.approx(0.01)


def test_unknown_architecture(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.update(architectures=["Qwen2ForCausalLM"], model_type="qwen2")
    (ckpt / "config.json").write_text(json.dumps(cfg))
    msg = _error(ckpt)
    assert msg.startswith("config.json: unknown architecture 'Qwen2ForCausalLM'")
    with pytest.raises(CheckpointError, match="config.json: unknown architecture"):
        read_model_config(ckpt)


def test_unknown_text_model_type_in_multimodal(tiny_checkpoint, tmp_path):
    d = _copy(tiny_checkpoint(layout="hf-multimodal"), tmp_path / "m")
    cfg = json.loads((d / "config.json").read_text())
    cfg["text_config"]["model_type"] = "gemma3"
    (d / "config.json").write_text(json.dumps(cfg))
    assert "config.json: unknown architecture: text_config.model_type 'gemma3'" in _error(d)


def test_truncated_file(ckpt):
    path = ckpt / "model.safetensors"
    data = path.read_bytes()
    path.write_bytes(data[: len(data) - 1000])
    msg = _error(ckpt)
    assert msg.startswith("model.safetensors: tensor '")
    assert "truncated" in msg


def test_truncated_header(ckpt):
    path = ckpt / "model.safetensors"
    path.write_bytes(path.read_bytes()[:100])
    msg = _error(ckpt)
    assert msg.startswith("model.safetensors: unreadable safetensors file; truncated or corrupt")


def test_missing_config(ckpt):
    (ckpt / "config.json").unlink()
    assert _error(ckpt).startswith(f"{ckpt / 'config.json'}: missing config")


def test_missing_weights(ckpt):
    (ckpt / "model.safetensors").unlink()
    assert "model.safetensors: missing" in _error(ckpt)


def test_index_points_at_missing_shard(tiny_checkpoint, tmp_path):
    d = _copy(tiny_checkpoint(shard_bytes=150_000), tmp_path / "s")
    index = json.loads((d / "model.safetensors.index.json").read_text())
    shard = index["weight_map"]["model.norm.weight"]
    (d / shard).unlink()
    msg = _error(d)
    assert msg.startswith("model.safetensors.index.json: tensor '")
    assert f"points at shard '{shard}', which is missing" in msg


def test_index_lists_tensor_absent_from_shard(tiny_checkpoint, tmp_path):
    d = _copy(tiny_checkpoint(shard_bytes=150_000), tmp_path / "s")
    path = d / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    wmap = index["weight_map"]
    assert wmap["model.norm.weight"] != wmap["model.embed_tokens.weight"]  # test setup
    wmap["model.norm.weight"] = wmap["model.embed_tokens.weight"]
    path.write_text(json.dumps(index))
    want = "model.safetensors.index.json: tensor 'model.norm.weight' is listed in shard"
    assert _error(d).startswith(want)


def test_bad_json(ckpt):
    (ckpt / "config.json").write_text("{not json")
    assert str(ckpt / "config.json") + ": not valid JSON" in _error(ckpt)


def test_rotary_inv_freq_buffers_are_ignored(ckpt):
    name = "model.layers.0.self_attn.rotary_emb.inv_freq"
    _edit(ckpt, lambda t: t.update({name: torch.ones(32)}))
    assert len(load_weights(ckpt, progress=False).layers) == 2


def _nan_code(t: dict, name: str, code: int, at: int = 5) -> None:
    u = t[name].view(torch.uint8).clone()
    u.view(-1)[at] = code
    t[name] = u.view(torch.float8_e4m3fn)


@pytest.mark.parametrize("code", [0x7F, 0xFF])
def test_a_nan_code_in_an_fp8_weight(ckpt, code):
    """e4m3fn's NaN codes loaded, every answer was empty; now the load names the place."""
    name = "model.layers.1.self_attn.q_proj.weight"
    _edit(ckpt, lambda t: _nan_code(t, name, code))
    assert _error(ckpt) == (f"model.safetensors: tensor '{name}': NaN code at flat index 5 "
                            "(row 0, column 5)")


@pytest.mark.parametrize("value", [float("nan"), float("-inf")])
def test_a_non_finite_bf16_weight(ckpt, value):
    def put(t):
        w = t["model.norm.weight"].clone()
        w[3] = value
        t["model.norm.weight"] = w
    _edit(ckpt, put)
    assert _error(ckpt).startswith("model.safetensors: tensor 'model.norm.weight': value ")
    assert "at flat index 3: not finite" in _error(ckpt)


def test_a_git_lfs_pointer_instead_of_the_weights(ckpt):
    (ckpt / "model.safetensors").write_text(
        "version https://git-lfs.github.com/spec/v1\noid sha256:abcd\nsize 2236176\n")
    assert _error(ckpt) == ("model.safetensors: a Git LFS pointer, not the weights (fetch "
                            "them: git lfs pull)")


def test_a_file_whose_header_length_exceeds_it(ckpt):
    """Eight bytes of text read as a header length of petabytes: an error naming the
    file (it was a MemoryError with no name)."""
    (ckpt / "model.safetensors").write_bytes(b"not a safetensors file at all\n" * 4)
    assert _error(ckpt).startswith("model.safetensors: unreadable safetensors file")


def test_a_missing_vision_tensor_names_it(tiny_checkpoint, tmp_path):
    from engine.vision.encoder import load_vision_encoder

    d = _copy(tiny_checkpoint(layout="hf-multimodal"), tmp_path / "mm")
    _edit(d, lambda t: t.pop("vision_tower.patch_conv.weight"))
    with pytest.raises(CheckpointError) as info:
        load_vision_encoder(d)
    assert str(info.value) == "model.safetensors: tensor 'vision_tower.patch_conv.weight' missing"


@pytest.mark.parametrize(("key", "value", "words"), [
    ("rms_norm_eps", -1.0, "rms_norm_eps must be a finite number > 0"),
    ("tie_word_embeddings", "false", "tie_word_embeddings must be true or false"),
    ("hidden_act", "gelu", "hidden_act 'gelu' unsupported"),
])
def test_config_values_that_were_read_silently(ckpt, key, value, words):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg[key] = value
    (ckpt / "config.json").write_text(json.dumps(cfg))
    assert _error(ckpt).startswith("config.json: ") and words in _error(ckpt)


def test_a_yarn_factor_of_zero_is_refused(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["rope_parameters"] = {**cfg.get("rope_parameters", cfg.get("rope_scaling") or {}),
                              "rope_type": "yarn", "factor": 0}
    cfg.pop("rope_scaling", None)
    (ckpt / "config.json").write_text(json.dumps(cfg))
    assert "rope factor must be >= 1" in _error(ckpt)


@pytest.mark.parametrize(("edit", "words"), [
    ({"quantization_config": "fp8"}, "quantization_config must be an object, got 'fp8'"),
    # its first letter was the architecture: "unknown architecture 'M'"
    ({"architectures": "Ministral3ForCausalLM"},
     "architectures must be a list of names, got 'Ministral3ForCausalLM'"),
    ({"rope_parameters": "yarn"}, "rope_parameters must be an object, got 'yarn'"),
    ({"rms_norm_eps": "x"}, "rms_norm_eps must be a finite number, got 'x'"),
    ({"num_hidden_layers": None}, "missing field 'num_hidden_layers'"),
    ({"num_attention_heads": [4]}, "num_attention_heads must be an integer, got [4]"),
    ({"hidden_size": "256"}, "hidden_size must be an integer, got '256'"),
    ({"hidden_size": 256.5}, "hidden_size must be an integer, got 256.5"),
    ({"num_hidden_layers": True}, "num_hidden_layers must be an integer, got True"),
    ({"num_key_value_heads": 0}, "num_kv_heads must be > 0"),
    # read with a warning only, before
    ({"max_position_embeddings": -5}, "max_position_embeddings must be > 0"),
    ({"eos_token_id": 99999}, "eos_token_id 99999 is outside the vocabulary"),
])
def test_config_values_of_the_wrong_type_name_their_key(ckpt, edit, words):
    """Python's own messages ('str' object has no attribute 'get', could not convert
    string to float) named no key; a string or a float read as an int passed."""
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.update(edit)
    if "rope_parameters" in edit:
        cfg.pop("rope_scaling", None)
    (ckpt / "config.json").write_text(json.dumps(cfg))
    assert _error(ckpt).startswith("config.json: ") and words in _error(ckpt), _error(ckpt)


@pytest.mark.parametrize(("edit", "words"), [
    ({"yarn": "x"}, "yarn must be an object, got 'x'"),
    ({"n_heads": "four"}, "n_heads must be an integer, got 'four'"),
    ({"tied_embeddings": "false"}, "tied_embeddings must be true or false"),
])
def test_native_params_of_the_wrong_type_name_their_key(tiny_checkpoint, tmp_path, edit, words):
    d = _copy(tiny_checkpoint(layout="native"), tmp_path / "n")
    p = json.loads((d / "params.json").read_text())
    p.update(edit)
    (d / "params.json").write_text(json.dumps(p))
    assert _error(d).startswith("params.json: ") and words in _error(d), _error(d)


def test_a_rope_parameter_of_the_wrong_type_names_its_place(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["rope_parameters"] = {**cfg["rope_parameters"], "rope_theta": "big"}
    (ckpt / "config.json").write_text(json.dumps(cfg))
    assert "config.json: rope_parameters.rope_theta must be a finite number, got 'big'" \
        == _error(ckpt)


def test_a_bf16_module_the_config_does_not_exclude_names_the_config_key(ckpt):
    """Dropping modules_to_not_convert leaves the bf16 lm_head without an FP8 scale: the
    error says the weight is not FP8 and which config key should name it."""
    cfg = json.loads((ckpt / "config.json").read_text())
    q = cfg.get("quantization_config") or cfg["text_config"]["quantization_config"]
    assert q.pop("modules_to_not_convert")
    (ckpt / "config.json").write_text(json.dumps(cfg))
    msg = _error(ckpt)
    assert "lm_head.weight_scale_inv' missing" in msg, msg
    assert "lm_head.weight' is bfloat16, not FP8: config.json quantization_config." \
           "modules_to_not_convert should list" in msg, msg


@pytest.mark.parametrize("head", ["lm_head.weight", "language_model.lm_head.weight"])
def test_a_quantized_lm_head_reads_its_scale_beside_it(ckpt, head):
    """A checkpoint that quantizes the head too (no modules_to_not_convert) keeps its scale
    beside the head's weight, outside the decoder's prefix: the head loads as FP8."""
    from engine.kernels.base import Fp8Weight
    from tests.engine.test_model_support import quantize_fp8

    cfg = json.loads((ckpt / "config.json").read_text())
    q = cfg.get("quantization_config") or cfg["text_config"]["quantization_config"]
    q.pop("modules_to_not_convert")
    (ckpt / "config.json").write_text(json.dumps(cfg))

    def quantize(t: dict) -> None:
        w = quantize_fp8(t.pop("lm_head.weight").float())
        stem = head.removesuffix("weight")
        t[head] = w.weight
        t[stem + "weight_scale_inv"] = w.scale.reshape(t[Q_SCALE].shape)
        if "model.layers.0.mlp.down_proj.activation_scale" in t:  # static activation scales
            t[stem + "activation_scale"] = w.activation_scale.reshape(
                t["model.layers.0.mlp.down_proj.activation_scale"].shape)

    _edit(ckpt, quantize)
    weights = load_weights(ckpt, progress=False)
    assert isinstance(weights.lm_head, Fp8Weight)


def test_a_tied_checkpoint_may_carry_a_quantized_head_copy(tiny_checkpoint, tmp_path):
    """tie_word_embeddings with an FP8 lm_head copy and its scales in the file: the copy
    is unused (the head is the embedding), not an unexpected tensor."""
    d = _copy(tiny_checkpoint(tie_word_embeddings=True), tmp_path / "tied")
    q = torch.zeros(8, 8).to(torch.float8_e4m3fn)
    _edit(d, lambda t: t.update({"lm_head.weight": q, "lm_head.weight_scale_inv": torch.ones(()),
                                 "lm_head.activation_scale": torch.ones(())}))
    assert load_weights(d, progress=False).lm_head is None


def _config(ckpt, **changes):
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg.update(changes)
    (ckpt / "config.json").write_text(json.dumps(cfg))


def test_yarn_attention_factor_and_truncate_are_read(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    rope = {**cfg.get("rope_parameters", cfg.get("rope_scaling") or {}), "rope_type": "yarn",
            "factor": 4.0, "original_max_position_embeddings": 64, "attention_factor": 2.0,
            "truncate": False}
    cfg.pop("rope_scaling", None)
    _config(ckpt, rope_parameters=rope)
    got = load_weights(ckpt, progress=False).config.rope
    assert (got.attention_factor, got.truncate) == (2.0, False)


def test_a_partial_rotary_factor_is_refused(ckpt):
    cfg = json.loads((ckpt / "config.json").read_text())
    rope = {**cfg.get("rope_parameters", cfg.get("rope_scaling") or {}),
            "partial_rotary_factor": 0.5}
    cfg.pop("rope_scaling", None)
    _config(ckpt, rope_parameters=rope)
    assert "partial_rotary_factor 0.5 unsupported" in _error(ckpt)


def test_sliding_window_is_read(ckpt):
    _config(ckpt, sliding_window=8)
    assert load_weights(ckpt, progress=False).config.sliding_window == 8


def test_a_bad_id_in_generation_config_names_that_file(ckpt):
    gen = json.loads((ckpt / "generation_config.json").read_text())
    (ckpt / "generation_config.json").write_text(json.dumps({**gen, "bos_token_id": 99999}))
    assert _error(ckpt).startswith("generation_config.json: bos_token_id 99999 is outside")
    (ckpt / "generation_config.json").write_text(json.dumps({**gen, "eos_token_id": [2, -1]}))
    assert _error(ckpt).startswith("generation_config.json: eos_token_id -1 is outside")


def test_more_layers_than_the_checkpoint_holds_fails_at_once(ckpt):
    """A config naming 10^12 layers listed every name first (minutes, gigabytes)."""
    _config(ckpt, num_hidden_layers=10**12)
    assert _error(ckpt) == ("model.safetensors: tensor 'model.layers.999999999999."
                            "input_layernorm.weight' missing (the config gives "
                            "1000000000000 layers)")


@pytest.mark.parametrize("shard", [5, "", "sub", "../x.safetensors"])
def test_an_index_entry_that_is_no_shard_file_names_the_index(tiny_checkpoint, tmp_path,
                                                              shard):
    d = _copy(tiny_checkpoint(shard_bytes=150_000), tmp_path / "s")
    (d / "sub").mkdir()
    path = d / "model.safetensors.index.json"
    index = json.loads(path.read_text())
    index["weight_map"]["model.norm.weight"] = shard
    path.write_text(json.dumps(index))
    msg = _error(d)
    assert msg.startswith("model.safetensors.index.json: tensor 'model.norm.weight' points at")


def test_a_directory_in_place_of_the_weights(ckpt):
    (ckpt / "model.safetensors").unlink()
    (ckpt / "model.safetensors").mkdir()
    assert _error(ckpt) == "model.safetensors: not a file (a safetensors file was expected)"


@pytest.mark.parametrize("fp8_weight", [True, False])
def test_a_scale_of_a_module_the_config_excludes_says_so(ckpt, fp8_weight):
    """modules_to_not_convert names a decoder linear whose scale is on disk: the error
    names that tensor and says the config excludes its module (not that the tensor is
    foreign to the decoder), and, when the weight is FP8, that the entry is wrong."""
    module = "model.layers.0.mlp.down_proj"
    cfg = json.loads((ckpt / "config.json").read_text())
    cfg["quantization_config"]["modules_to_not_convert"].append(module)
    (ckpt / "config.json").write_text(json.dumps(cfg))
    if not fp8_weight:
        _edit(ckpt, lambda t: t.update({f"{module}.weight": torch.zeros(
            t[f"{module}.weight"].shape, dtype=torch.bfloat16)}))
    msg = _error(ckpt)
    assert msg.startswith(f"model.safetensors: tensor '{module}.") and " unexpected (" in msg
    assert "not part of the text decoder" not in msg, msg
    assert (f"a scale of '{module}', which config.json quantization_config."
            "modules_to_not_convert lists") in msg, msg
    if fp8_weight:
        assert msg.endswith("its weight is float8_e4m3fn: remove the module from that list)")
    else:
        assert msg.endswith("its weight is bfloat16, so the scale is stray)"), msg


def test_fp8_scales_in_a_checkpoint_whose_config_has_no_quantization(ckpt):
    """Without quantization_config every linear is read as bf16: the first FP8 scale was
    'not part of the text decoder', which pointed at the tensor, not at the config."""
    cfg = json.loads((ckpt / "config.json").read_text())
    del cfg["quantization_config"]
    (ckpt / "config.json").write_text(json.dumps(cfg))
    msg = _error(ckpt)
    assert msg.startswith("model.safetensors: tensor 'model.layers.0.") and msg.endswith(
        "' unexpected (an FP8 scale, but config.json has no quantization_config, so the "
        "checkpoint is read as bf16; an FP8 one has quantization_config.quant_method fp8)")


def test_fp8_scales_in_a_native_checkpoint_without_quantization(tiny_checkpoint, tmp_path):
    d = _copy(tiny_checkpoint(layout="native"), tmp_path / "n")
    p = json.loads((d / "params.json").read_text())
    del p["quantization"]
    (d / "params.json").write_text(json.dumps(p))
    assert _error(d).endswith("unexpected (an FP8 scale, but params.json has no quantization "
                              "section, so the checkpoint is read as bf16; an FP8 one has "
                              "quantization.qformat_weight fp8_e4m3)")


def test_a_scale_named_weight_scale_is_pointed_at(ckpt):
    """compressed-tensors' spelling: the error named weight_scale_inv missing only."""
    _edit(ckpt, lambda t: t.update({Q_SCALE.removesuffix("_inv"): t.pop(Q_SCALE)}))
    assert _error(ckpt) == (f"model.safetensors: tensor '{Q_SCALE}' missing "
                            f"('{Q_SCALE.removesuffix('_inv')}' is there: quant_method fp8 "
                            "names the weight's dequantization multiplier weight_scale_inv)")


@pytest.mark.parametrize("block", [[0, 128], [128], "128", [128, 128.0], [-1, 128]])
def test_a_weight_block_size_that_is_no_block_says_what_it_takes(tiny_checkpoint, tmp_path,
                                                                 block):
    """'must be [bn, bk] or null' did not say that 0 or a float is no block size, nor
    where in config.json the key is."""
    d = _copy(tiny_checkpoint(quant="fp8-block"), tmp_path / "b")
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"]["weight_block_size"] = block
    (d / "config.json").write_text(json.dumps(cfg))
    assert _error(d) == (f"config.json: quantization_config.weight_block_size {block!r}: two "
                         "integers > 0, [block_n, block_k], or null (per-tensor scales)")
