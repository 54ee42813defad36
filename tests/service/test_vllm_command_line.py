"""The command line vLLM users bring: the published Ministral-3 one (`vllm serve MODEL
--tokenizer_mode mistral --config_format mistral --load_format mistral
--enable-auto-tool-choice --tool-call-parser mistral`) runs as it is written. The model
may be positional, flags may use underscores; --config-format / --load-format choose the
layout read from a directory holding both (as published repos do), --tokenizer-mode the
tokenizer file and chat encoding."""

from __future__ import annotations

import shutil

import pytest
from fastapi.testclient import TestClient

from cli.main import CliError, build_parser, dashed
from cli.serve import settings_from_args
from cli.serve_server import uvicorn_config
from engine.checkpoint.detect import Layout, detect_layout
from engine.checkpoint.errors import CheckpointError
from engine.text.tokenizer import Tokenizer, TokenizerLoadError
from engine.text.tokenizer_tekken import TekkenBackend
from service.app import create_app
from service.settings import Settings

MODEL_CARD = ["--tokenizer_mode", "mistral", "--config_format", "mistral", "--load_format",
              "mistral", "--enable-auto-tool-choice", "--tool-call-parser", "mistral"]
ASK = {"messages": [{"role": "system", "content": "Be brief."},
                    {"role": "user", "content": "Hello there"}],
       "max_tokens": 6, "temperature": 0, "ignore_eos": True}


def settings(argv: list[str]) -> Settings:
    return settings_from_args(build_parser().parse_args(dashed(["serve", *argv])))


@pytest.fixture(scope="module")
def both(tiny_checkpoint, tmp_path_factory):
    """A directory with both layouts, as published repos ship them: the Hugging Face
    files of seed 0 and the Mistral-native files of seed 1 (so which one is read shows in
    the answers), and every tokenizer file (tokenizer.json, tekken.json, the template)."""
    hf = tiny_checkpoint(layout="hf-text", tokenizer="published", seed=0)
    native = tiny_checkpoint(layout="native", tokenizer="published", seed=1)
    out = tmp_path_factory.mktemp("both") / "ministral"
    shutil.copytree(hf, out)
    for name in ("params.json", "consolidated.safetensors"):
        shutil.copy(native / name, out / name)
    return out, hf, native


def test_the_model_card_command_line_parses(both):
    s = settings([str(both[0]), *MODEL_CARD])
    assert s.model == both[0] and s.tokenizer_mode == "mistral"
    assert (s.config_format, s.load_format, s.checkpoint_layout) == ("mistral", "mistral",
                                                                     "native")
    assert s.enable_auto_tool_choice and s.tool_call_parser == "mistral"
    assert dashed(["--max_model_len=8", "--x", "a_b"]) == ["--max-model-len=8", "--x", "a_b"]
    assert settings(["--config-format", "hf"]).checkpoint_layout == "hf"
    assert settings([]).checkpoint_layout is None


@pytest.mark.parametrize("argv, words", [
    (["--config-format", "mistral", "--load-format", "safetensors"], "different layouts"),
    (["--enable-auto-tool-choice", "--tool-call-parser", "none"], "tool-call parser"),
    (["/a", "--model", "/b"], "two models")])
def test_contradictions_are_errors(argv, words):
    with pytest.raises(CliError, match=words):
        settings(argv)


def test_the_layout_asked_for_is_the_one_read(both):
    out, hf, native = both
    assert detect_layout(out) is Layout.HF  # the default where both are there
    assert detect_layout(out, "native") is Layout.NATIVE
    with pytest.raises(CheckpointError, match="params.json: missing"):
        detect_layout(hf, "native")
    with pytest.raises(CheckpointError, match="config.json: missing"):
        detect_layout(native, "hf")

    def answer(model, **kw):
        with TestClient(create_app(Settings(model=model, max_model_len=256,
                                            kv_cache_gib=0.02, **kw))) as c:
            r = c.post("/v1/chat/completions", json=ASK)
            assert r.status_code == 200, r.text
            return r.json()["choices"][0]["message"]["content"]

    mistral = {"config_format": "mistral", "load_format": "mistral"}
    assert answer(out) == answer(hf)
    assert answer(out, **mistral) == answer(native)
    assert answer(native) != answer(hf)  # the seeds differ: the checks above mean something


def test_tokenizer_modes(both):
    out = both[0]
    auto, hf, mistral = (Tokenizer.from_dir(out, m) for m in ("auto", "hf", "mistral"))
    assert auto.chat_template is not None and not isinstance(auto.backend, TekkenBackend)
    assert hf.chat_template == auto.chat_template
    assert mistral.chat_template is None and isinstance(mistral.backend, TekkenBackend)
    # the published template and mistral-common encode a chat with a system prompt alike
    msgs = ASK["messages"]
    assert mistral.encode_chat(msgs) == auto.encode_chat(msgs)
    with TestClient(create_app(Settings(model=out, tokenizer_mode="mistral",
                                        max_model_len=256, kv_cache_gib=0.02))) as c:
        assert c.post("/tokenize", json={"messages": msgs}).json()["tokens"] == (
            mistral.encode_chat(msgs))
    tekken_only = both[2].parent / "tekken-only"
    tekken_only.mkdir(exist_ok=True)
    shutil.copy(out / "tekken.json", tekken_only / "tekken.json")
    with pytest.raises(TokenizerLoadError, match="tokenizer.json: missing"):
        Tokenizer.from_dir(tekken_only, "hf")


CUSTOM = ("{% for m in messages %}<|im_start|>{{ m.role }}\nCUSTOM {{ m.content }}<|im_end|>\n"
          "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.mark.parametrize("as_file", [True, False], ids=["file", "inline"])
def test_chat_template_replaces_the_checkpoints(tmp_path, as_file):
    """vLLM's --chat-template (a file or the template itself) renders every chat."""
    from engine.demo_model import ensure_demo_model
    demo = ensure_demo_model()
    value = CUSTOM
    if as_file:
        (tmp_path / "t.jinja").write_text(CUSTOM)
        value = str(tmp_path / "t.jinja")
    msgs = [{"role": "user", "content": "Paris?"}]
    ours = Tokenizer.from_dir(demo, chat_template=CUSTOM)
    want = ours.encode("<|im_start|>user\nCUSTOM Paris?<|im_end|>\n<|im_start|>assistant\n",
                       add_special_tokens=False)
    assert ours.encode_chat(msgs) == want != Tokenizer.from_dir(demo).encode_chat(msgs)
    with TestClient(create_app(Settings(model=demo, chat_template=value, max_model_len=256,
                                        kv_cache_gib=0.02))) as c:
        assert c.post("/tokenize", json={"messages": msgs}).json()["tokens"] == want
        r = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 2})
        assert r.json()["usage"]["prompt_tokens"] == len(want)


@pytest.mark.parametrize("value, words", [
    ("/no/such/template.jinja", "no such file"), ("{% for x in %}", "syntax error")])
def test_a_bad_chat_template_stops_the_server_naming_it(value, words):
    from cli.serve_startup import _load_backend
    with pytest.raises(CliError, match=words):
        _load_backend(settings(["--chat-template", value]))


def test_no_template_in_mistral_tokenizer_mode(both):
    with pytest.raises(TokenizerLoadError, match="mistral-common"):
        Tokenizer.from_dir(both[0], "mistral", CUSTOM)


def test_chat_template_content_format_chooses_what_the_template_reads():
    """vLLM's --chat-template-content-format: contents as strings or as part lists,
    whatever the template looks like it reads."""
    from engine.demo_model import ensure_demo_model
    probe = ("{% for m in messages %}{% if m.content is string %}S{% else %}L{% endif %}"
             "{% endfor %}")
    demo = ensure_demo_model()
    msgs = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    seen = {}
    for fmt in ("auto", "string", "openai"):
        tok = Tokenizer.from_dir(demo, chat_template=probe, content_format=fmt)
        seen[fmt] = tok.decode(tok.encode_chat(msgs, add_generation_prompt=False))
    assert (seen["string"], seen["openai"]) == ("S", "L")
    assert seen["auto"] == "S"  # the probe reads no parts: strings
    with TestClient(create_app(Settings(model=demo, chat_template=probe, max_model_len=256,
                                        chat_template_content_format="openai",
                                        kv_cache_gib=0.02))) as c:
        r = c.post("/tokenize", json={"messages": msgs, "add_generation_prompt": False})
        assert c.post("/detokenize", json={"tokens": r.json()["tokens"]}).json()[
            "prompt"] == "L"


def test_a_request_chat_template_needs_the_servers_trust():
    """vLLM's chat_template on a request: a 400 naming it unless the server was started
    with --trust-request-chat-template; then it renders that request (and /tokenize)."""
    from engine.demo_model import ensure_demo_model
    demo = ensure_demo_model()
    msgs = [{"role": "user", "content": "Paris?"}]
    body = {"messages": msgs, "max_tokens": 2, "chat_template": CUSTOM}
    want = Tokenizer.from_dir(demo, chat_template=CUSTOM).encode_chat(msgs)
    base = {"model": demo, "max_model_len": 256, "kv_cache_gib": 0.02}
    with TestClient(create_app(Settings(**base))) as c:
        for route, extra in (("/v1/chat/completions", {}), ("/tokenize", {"max_tokens": None})):
            r = c.post(route, json={**body, **extra})
            assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template"
            assert "--trust-request-chat-template" in r.json()["error"]["message"]
    with TestClient(create_app(Settings(**base, trust_request_chat_template=True))) as c:
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(want)
        assert c.post("/tokenize", json={"messages": msgs, "chat_template": CUSTOM}).json()[
            "tokens"] == want
        plain = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 2})
        assert plain.json()["usage"]["prompt_tokens"] != len(want)  # the model's own
        r = c.post("/v1/chat/completions", json={**body, "chat_template": "{% if %}"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "chat_template"
        assert "syntax error" in r.json()["error"]["message"]


@pytest.mark.parametrize("text, n", [("32k", 32000), ("32K", 32768), ("25.6k", 25600),
                                     ("1.1k", 1100), ("0.5K", 512), ("4096", 4096)])
def test_token_counts_take_vllms_units(text, n, monkeypatch):
    assert settings(["--max-model-len", text]).max_model_len == n
    assert settings(["--max-num-batched-tokens", text]).max_num_batched_tokens == n
    monkeypatch.setenv("FP8SERVE_MAX_MODEL_LEN", text)
    assert Settings().max_model_len == n


@pytest.mark.parametrize("text", ["1.0005k", "2.5x", "infk", "nan", ""])
def test_a_token_count_that_is_not_whole_is_refused(text, capsys):
    with pytest.raises(SystemExit):
        settings(["--max-model-len", text])
    assert "--max-model-len" in capsys.readouterr().err


def test_vllm_flags_at_the_values_that_describe_this_server(both):
    """--dtype auto|bfloat16, --tensor-parallel-size 1, --trust-remote-code,
    --enforce-eager, --enable-chunked-prefill, --block-size 16, --max-logprobs 20,
    --disable-log-stats run (they describe what this server does), and
    --uvicorn-log-level sets uvicorn's; other values are refused."""
    s = settings([str(both[0]), "--dtype", "bfloat16", "--tensor_parallel_size", "1",
                  "--trust-remote-code"])
    assert (s.dtype, s.tensor_parallel_size, s.trust_remote_code) == ("bfloat16", 1, True)
    for argv in (["--dtype", "float16"], ["--tensor-parallel-size", "2"],
                 ["--block-size", "32"], ["--max-logprobs", "100"],
                 ["--uvicorn-log-level", "loud"]):
        with pytest.raises(SystemExit):
            settings(argv)
    s = settings(["--enforce-eager", "--enable-chunked-prefill", "--block-size", "16",
                  "--max-logprobs", "20", "--disable-log-stats",
                  "--uvicorn-log-level", "warning"])
    assert (s.enforce_eager, s.enable_chunked_prefill, s.block_size, s.max_logprobs,
            s.disable_log_stats, s.uvicorn_log_level) == (True, True, 16, 20, True, "warning")
    assert uvicorn_config(None, s).log_level == "warning"
    with pytest.raises(CliError, match="always prefilled in chunks"):
        settings(["--no-enable-chunked-prefill"])


RAG = ("{% for d in documents %}[DOC {{ d.title }}] {{ d.text }}\n{% endfor %}"
       "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
       "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def test_documents_reach_a_template_that_reads_them():
    """vLLM's documents (retrieval-augmented templates): the template's documents
    variable; where the template reads none, a 400 naming the field (not dropped)."""
    from engine.demo_model import ensure_demo_model
    demo = ensure_demo_model()
    docs = [{"title": "Paris", "text": "Paris is the capital of France."}]
    body = {"messages": [{"role": "user", "content": "Capital?"}], "max_tokens": 2,
            "documents": docs}
    tok = Tokenizer.from_dir(demo)
    want = tok.encode("[DOC Paris] Paris is the capital of France.\n<|im_start|>user\n"
                      "Capital?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    base = {"model": demo, "max_model_len": 256, "kv_cache_gib": 0.02}
    with TestClient(create_app(Settings(**base, chat_template=RAG))) as c:
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200 and r.json()["usage"]["prompt_tokens"] == len(want)
    with TestClient(create_app(Settings(**base))) as c:  # the demo's template reads none
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 400 and r.json()["error"]["param"] == "documents"
        assert c.post("/v1/chat/completions", json={**body, "documents": None}
                      ).status_code == 200


def test_quantization_fp8_names_what_is_served(tiny_checkpoint):
    """--quantization fp8 (vLLM's) serves an FP8 checkpoint as it is; with a bf16 one the
    server does not start (vLLM would quantize at load; this server does not)."""
    from service.backend import load_backend

    fp8 = load_backend(Settings(model=tiny_checkpoint(tokenizer=True), kv_cache_gib=0.01,
                                quantization="fp8"))
    assert fp8.runner.config.quant.method == "fp8"
    with pytest.raises(CheckpointError, match="--quantization fp8: .* holds bf16 weights"):
        load_backend(Settings(model=tiny_checkpoint(quant="bf16", tokenizer=True),
                              kv_cache_gib=0.01, quantization="fp8"))
    assert settings(["--quantization", "fp8"]).quantization == "fp8"
    with pytest.raises(SystemExit):
        settings(["--quantization", "awq"])
