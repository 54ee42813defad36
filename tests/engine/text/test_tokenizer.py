import json

import pytest

from engine.text.chat_template import ChatTemplateError, render_chat_template
from engine.text.tokenizer import Tokenizer, TokenizerLoadError
from tests.engine.text.tokenizer_fixtures import write_bpe_dir, write_tekken_dir

MSGS = [{"role": "user", "content": "Hello, world!"}]


@pytest.fixture(scope="module")
def bpe(tmp_path_factory):
    return Tokenizer.from_dir(write_bpe_dir(tmp_path_factory.mktemp("bpe")))


@pytest.fixture(scope="module")
def tekken(tmp_path_factory):
    return Tokenizer.from_dir(write_tekken_dir(tmp_path_factory.mktemp("tekken")))


def test_bpe_roundtrip_and_specials(bpe):
    text = "héllo wörld 日本語 🎉 Paris"
    ids = bpe.encode(text)
    assert bpe.decode(ids) == text
    im_start = bpe.backend.token_to_id("<|im_start|>")
    assert bpe.encode("<|im_start|>user")[0] == im_start
    assert bpe.is_special(im_start)
    assert bpe.decode([im_start] + ids) == text
    assert bpe.decode([im_start] + ids, skip_special_tokens=False).startswith("<|im_start|>")
    assert bpe.vocab_size > 260 and bpe.id_to_token(bpe.vocab_size - 1)
    assert bpe.id_to_token(bpe.vocab_size) == ""


def test_bpe_special_ids_from_configs(bpe):
    im_end = bpe.backend.token_to_id("<|im_end|>")
    # generation_config eos [0, 2] plus tokenizer_config eos_token <|im_end|> (id 2)
    assert bpe.eos_token_ids == frozenset({0, 2}) and im_end == 2
    assert bpe.bos_token_id == bpe.backend.token_to_id("<s>")
    assert bpe.eos_token == "<|im_end|>" and bpe.bos_token == "<s>"
    # the tokenizer's own EOS; 0 (generation_config's) ends a request as a stop token id
    assert bpe.primary_eos_id == im_end


def test_bpe_chat_template_render_and_encode(bpe):
    text = bpe.apply_chat_template(MSGS)
    assert text == ("<|im_start|>system\nYou are helpful.<|im_end|>\n"
                    "<|im_start|>user\nHello, world!<|im_end|>\n<|im_start|>assistant\n")
    ids = bpe.encode_chat(MSGS)
    assert ids == bpe.encode(text, add_special_tokens=False)
    assert ids[0] == bpe.backend.token_to_id("<|im_start|>")
    assert ids.count(bpe.backend.token_to_id("<|im_end|>")) == 2
    no_gen = bpe.apply_chat_template(MSGS, add_generation_prompt=False)
    assert not no_gen.endswith("assistant\n")
    parts = [{"role": "user", "content": [{"type": "text", "text": "Hello, "},
                                          {"type": "text", "text": "world!"}]}]
    # a string template gets the parts joined with "\n", as vLLM joins them
    assert bpe.apply_chat_template(parts) == text.replace("Hello, world!", "Hello, \nworld!")


def test_template_list_in_tokenizer_config(tmp_path):
    tok = Tokenizer.from_dir(write_bpe_dir(tmp_path, template_in_config=True))
    assert tok.apply_chat_template(MSGS).endswith("<|im_start|>assistant\n")


@pytest.mark.parametrize("messages, match", [
    ([], "non-empty"), ("hi", "non-empty"), ([{"role": "wizard", "content": "x"}], "role"),
    ([{"role": "user", "content": 5}], "content"),
    ([{"role": "user", "content": [{"type": "image_url"}]}], "image_url"), (["x"], "object"),
])
def test_bad_messages_raise_chat_template_error(bpe, messages, match):
    with pytest.raises(ChatTemplateError, match=match):
        bpe.encode_chat(messages)


def test_template_features_and_errors():
    src = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'tool' %}"
           "{{ raise_exception('no tools') }}{% endif %}{{ m | tojson }}{% endfor %}"
           "{{ strftime_now('%Y')|length }}")
    out = render_chat_template(src, [{"role": "user", "content": "é"}], True,
                               {"bos_token": "<s>"})
    assert out == '<s>{"role": "user", "content": "é"}4'
    with pytest.raises(ChatTemplateError, match="no tools"):
        render_chat_template(src, [{"role": "tool", "content": "x"}])
    with pytest.raises(ChatTemplateError, match="syntax"):
        render_chat_template("{% for %}", MSGS)
    with pytest.raises(ChatTemplateError):  # sandbox: no attribute escapes
        render_chat_template("{{ messages.__class__.__mro__ }}{{ ''.__class__.mro() }}", MSGS)


def test_no_template(tmp_path):
    tok = Tokenizer.from_dir(write_bpe_dir(tmp_path, chat_template=None))
    with pytest.raises(ChatTemplateError, match="no chat template"):
        tok.encode_chat(MSGS)


@pytest.mark.parametrize("in_config", [False, True])
def test_a_template_that_does_not_compile_fails_at_load_naming_its_file(tmp_path, in_config):
    """It loaded, and every chat request was then a 400 blaming the client's messages."""
    d = write_bpe_dir(tmp_path, chat_template="{% for m in messages %}{{ m.content }",
                      template_in_config=in_config)
    where = "tokenizer_config.json" if in_config else "chat_template.jinja"
    with pytest.raises(TokenizerLoadError, match=rf"{where}: chat template syntax error line 1"):
        Tokenizer.from_dir(d)
    with pytest.raises(TokenizerLoadError, match="--chat-template: chat template syntax"):
        Tokenizer.from_dir(write_bpe_dir(tmp_path / "flag"), chat_template="{{ x")


def test_missing_and_broken_tokenizer(tmp_path):
    with pytest.raises(TokenizerLoadError, match="no tokenizer.json"):
        Tokenizer.from_dir(tmp_path)
    (tmp_path / "tokenizer.json").write_text("{not json")
    with pytest.raises(TokenizerLoadError, match="tokenizer.json"):
        Tokenizer.from_dir(tmp_path)


def test_tekken_reference_encoding(tekken):
    assert tekken.encode("<s>[INST]Hello, world![/INST]", add_special_tokens=False) == \
        [1, 3, 22177, 1044, 4304, 1033, 4]
    assert tekken.encode("Hello, world!") == [1, 22177, 1044, 4304, 1033]
    assert tekken.bos_token_id == 1 and 2 in tekken.eos_token_ids
    assert tekken.vocab_size == 131072
    assert tekken.decode([1, 3, 22177, 4]) == "Hello"
    assert tekken.decode([1, 3, 22177, 4], skip_special_tokens=False) == "<s>[INST]Hello[/INST]"
    # ids past tekken.json's vocabulary (a model's padded vocab_size) decode to nothing, as
    # tokenizer.json's do (mistral-common raised: a 500 for every request that drew one)
    assert tekken.decode([22177, 131072, 200000]) == "Hello"
    assert tekken.id_to_token(3) == "[INST]" and tekken.is_special(3)


def test_tekken_chat_via_mistral_common(tekken):
    assert tekken.encode_chat(MSGS) == [1, 3, 22177, 1044, 4304, 1033, 4]
    assert tekken.apply_chat_template(MSGS) == "<s>[INST]Hello, world![/INST]"
    with pytest.raises(ChatTemplateError):
        tekken.encode_chat([{"role": "assistant", "content": "x"}])


def test_tekken_with_jinja_template_does_not_double_bos(tmp_path):
    d = write_tekken_dir(tmp_path)
    (d / "chat_template.jinja").write_text(
        "{{ bos_token }}{% for m in messages %}[INST]{{ m.content }}[/INST]{% endfor %}")
    (d / "generation_config.json").write_text(json.dumps({"bos_token_id": 1,
                                                          "eos_token_id": 2}))
    tok = Tokenizer.from_dir(d)
    assert tok.encode_chat(MSGS) == [1, 3, 22177, 1044, 4304, 1033, 4]


def test_a_tekken_file_missing_a_key_names_the_key(tmp_path):
    """mistral-common's KeyError read as the bare key: "cannot load tekken tokenizer:
    'config'"."""
    (tmp_path / "tekken.json").write_text("{}")
    with pytest.raises(TokenizerLoadError) as info:
        Tokenizer.from_dir(tmp_path)
    assert str(info.value) == (f"{tmp_path / 'tekken.json'}: cannot load tekken tokenizer: "
                               "missing key 'config'")


def test_a_chat_template_flag_that_does_not_compile_names_the_flag_and_file(tmp_path):
    """The server stopped with 'chat template syntax error line 1: ...' and no word of
    --chat-template or of the file it read."""
    from engine.text.chat_template import template_from_flag

    bad = tmp_path / "t.jinja"
    bad.write_text("{% for m in messages %}{{ m.content }")
    with pytest.raises(ChatTemplateError) as info:
        template_from_flag(str(bad))
    assert str(info.value).startswith(f"--chat-template {bad}: chat template syntax error "
                                      "line 1: ")
    with pytest.raises(ChatTemplateError, match="^--chat-template: chat template syntax "
                                                "error line 1: "):
        template_from_flag("{{ x")


@pytest.mark.parametrize(("name", "content", "words"), [
    ("chat_template.jinja", b"\xff\xfe{{ x }}", "chat_template.jinja: not UTF-8 text"),
    ("chat_template.jinja", b"  \n", "chat_template.jinja: the chat template is empty"),
    ("tokenizer_config.json", b'{"chat_template": 123}', "tokenizer_config.json: "
     'chat_template must be a string or a list of {"name", "template"} objects, got 123'),
])
def test_a_chat_template_that_is_no_template_fails_at_load_naming_its_file(
        tmp_path, name, content, words):
    """Undecodable bytes stopped the server with UnicodeDecodeError's words alone; an empty
    file and a non-string chat_template loaded, and chat requests then had no template."""
    d = write_bpe_dir(tmp_path)
    (d / "chat_template.jinja").unlink(missing_ok=True)
    if name == "tokenizer_config.json":
        cfg = json.loads((d / name).read_text()) if (d / name).is_file() else {}
        cfg.update(json.loads(content))
        content = json.dumps(cfg).encode()
    (d / name).write_bytes(content)
    with pytest.raises(ChatTemplateError) as info:
        Tokenizer.from_dir(d)
    assert str(info.value).startswith(f"{d}/{words}"), str(info.value)


def test_a_chat_template_flag_file_that_is_not_text_names_the_file(tmp_path):
    from engine.text.chat_template import template_from_flag

    (tmp_path / "t.jinja").write_bytes(b"\xff\xfe{{ x }}")
    with pytest.raises(ChatTemplateError, match="t.jinja: not UTF-8 text"):
        template_from_flag(str(tmp_path / "t.jinja"))


def test_eos_settings_outside_the_vocabulary_are_named_at_load(tmp_path, caplog):
    """An eos_token text no token spells, or an eos_token_id past the vocabulary, stops
    nothing: each is a startup warning naming the file and the value (they were dropped
    without a word), and a model left with no EOS at all says that its answers end only
    at a limit."""
    import logging

    d = write_bpe_dir(tmp_path)
    (d / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<|nope|>"}))
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 99999]}))
    with caplog.at_level(logging.WARNING, logger="engine.text.tokenizer"):
        tok = Tokenizer.from_dir(d)
    assert tok.eos_token_ids == frozenset({2})
    said = [r.getMessage() for r in caplog.records]
    assert any("tokenizer_config.json: eos_token '<|nope|>' is no token" in m for m in said)
    assert any("eos_token_id [99999] outside the vocabulary" in m for m in said)
    assert not any("no EOS token" in m for m in said)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": 99999}))
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="engine.text.tokenizer"):
        assert Tokenizer.from_dir(d).eos_token_ids == frozenset()
    assert any("no EOS token: answers end only at max_tokens" in r.getMessage()
               for r in caplog.records)
