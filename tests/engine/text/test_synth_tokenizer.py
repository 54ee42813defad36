"""engine/synth/tokenizer.py: synth checkpoints ship a Tekken v13 tekken.json (Ministral-3's
special tokens at their published ids) that mistral-common loads, the engine encodes chat
through mistral-common, and the optional Hugging Face pair encodes the same ids."""

from __future__ import annotations

import argparse

import pytest

import cli.synth_model
from engine.synth import SynthSpec, write_checkpoint
from engine.synth.tokenizer import num_special_tokens, write_tekken
from engine.text.tokenizer import Tokenizer

PUBLISHED = {0: "<unk>", 1: "<s>", 2: "</s>", 3: "[INST]", 4: "[/INST]", 5: "[AVAILABLE_TOOLS]",
             6: "[/AVAILABLE_TOOLS]", 7: "[TOOL_RESULTS]", 8: "[/TOOL_RESULTS]",
             9: "[TOOL_CALLS]", 10: "[IMG]", 11: "<pad>", 12: "[IMG_BREAK]", 13: "[IMG_END]",
             17: "[SYSTEM_PROMPT]", 18: "[/SYSTEM_PROMPT]", 32: "[ARGS]", 33: "[CALL_ID]",
             34: "[THINK]", 35: "[/THINK]"}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Current weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]
CHAT = [{"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "abcDEF123", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "abcDEF123", "content": "sunny"},
        {"role": "user", "content": "Thanks!"}]


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="fp8serve")
    cli.synth_model.register(parser.add_subparsers())
    args = parser.parse_args(argv)
    return args.func(args)


@pytest.fixture(scope="module")
def tiny_dirs(tiny_checkpoint):
    return {fmt: tiny_checkpoint(tokenizer=fmt) for fmt in ("tekken", "both")}


@pytest.mark.parametrize("vocab_size", [1024, 131072])
def test_tekken_json_is_v13_with_published_ids(tmp_path, vocab_size):
    from mistral_common.tokens.tokenizers.base import TokenizerVersion
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    path = write_tekken(tmp_path, vocab_size)
    mt = MistralTokenizer.from_file(str(path))
    tok = mt.instruct_tokenizer.tokenizer
    assert mt.version == TokenizerVersion.v13 and tok.n_words == vocab_size
    assert tok.num_special_tokens == num_special_tokens(vocab_size)
    assert {i: tok.id_to_piece(i) for i in PUBLISHED} == PUBLISHED
    assert (tok.bos_id, tok.eos_id, tok.pad_id, tok.unk_id) == (1, 2, 11, 0)
    assert mt.instruct_tokenizer.BEGIN_THINK == 34 and mt.instruct_tokenizer.END_THINK == 35


def test_cli_tiny_writes_tekken_by_default(tmp_path):
    assert _cli(["synth-model", "--shape", "tiny", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "tekken.json").is_file() and not (tmp_path / "tokenizer.json").exists()
    assert Tokenizer.from_dir(tmp_path).vocab_size == 1024


def test_multimodal_tekken_has_the_image_block(tmp_path):
    from mistral_common.tokens.tokenizers.mistral import MistralTokenizer

    write_checkpoint(tmp_path, SynthSpec.preset("tiny", layout="hf-multimodal", tokenizer=True))
    enc = MistralTokenizer.from_file(str(tmp_path / "tekken.json")).instruct_tokenizer
    assert enc.image_encoder is not None
    assert enc.image_encoder.image_config.image_patch_size == 14


def test_engine_tokenizer_round_trip(tiny_dirs):
    tok = Tokenizer.from_dir(tiny_dirs["tekken"])
    assert type(tok.backend).__name__ == "TekkenBackend" and tok.vocab_size == 1024
    text = "Hello, world! Ünïcode 123 [INST] é"
    ids = tok.encode(text, add_special_tokens=False)
    assert 3 in ids and all(0 <= i < 1024 for i in ids)
    assert tok.decode(ids, skip_special_tokens=False) == text
    assert tok.bos_token_id == 1 and tok.eos_token_ids == frozenset({2})


def test_chat_with_tools_encodes_through_mistral_common(tiny_dirs):
    tok = Tokenizer.from_dir(tiny_dirs["tekken"])
    ids = tok.encode_chat(CHAT, tools=TOOLS)
    assert ids[:2] == [1, 17]  # <s>[SYSTEM_PROMPT]
    assert ids.index(5) < ids.index(6) < ids.index(3)  # tools come before the first [INST]
    text = tok.decode(ids, skip_special_tokens=False)
    assert '[AVAILABLE_TOOLS][{"type": "function", "function": {"name": "get_weather"' in text
    assert '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris"}</s>' in text
    assert text.endswith("[TOOL_RESULTS]sunny[/TOOL_RESULTS][INST]Thanks![/INST]")


def test_hf_pair_matches_tekken(tiny_dirs):
    d = tiny_dirs["both"]
    assert {p.name for p in d.iterdir()} >= {"tekken.json", "tokenizer.json",
                                             "chat_template.jinja", "tokenizer_config.json"}
    hf, tekken = Tokenizer.from_dir(d), Tokenizer.from_dir(tiny_dirs["tekken"])
    assert type(hf.backend).__name__ == "HfBackend" and hf.vocab_size == 1024
    text = "Tools: [TOOL_CALLS]get_weather[ARGS]{\"city\": \"Paris\"} ✓"
    assert hf.encode(text, False) == tekken.encode(text, False)
    assert hf.encode_chat(CHAT, tools=TOOLS) == tekken.encode_chat(CHAT, tools=TOOLS)


def test_hf_only_writes_no_tekken(tmp_path):
    res = write_checkpoint(tmp_path, SynthSpec.preset("tiny", tokenizer="hf"))
    assert "tekken.json" not in res.files and "tokenizer.json" in res.files
    assert not (tmp_path / "tekken.json").exists()


def test_spec_rejects_bad_tokenizer():
    with pytest.raises(ValueError, match="tokenizer 'sentencepiece'"):
        SynthSpec(tokenizer="sentencepiece")
    with pytest.raises(ValueError, match="vocab_size >= 356"):
        SynthSpec(vocab_size=300, tokenizer="tekken")
    assert SynthSpec(tokenizer=False).tokenizer == "none"
