"""A refused `fp8serve serve` setting is named as the operator gave it: the flag and its
value, or the environment variable and its value, with what it takes. The message named
the Settings field (``max_num_seqs: Input should be ...``), said ``: Value error, ...`` for
checks across fields, and did not say which of flag or environment held the value."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from cli.main import CliError, build_parser
from cli.serve import settings_from_args
from cli.settings_errors import env_name, flag_name


def _error(argv: list[str]) -> str:
    with pytest.raises(CliError) as info:
        settings_from_args(build_parser().parse_args(["serve", *argv]))
    msg = str(info.value)
    assert "\n" not in msg and "Value error" not in msg and not msg.startswith(":")
    return msg


@pytest.mark.parametrize(("argv", "want"), [
    (["--max-num-seqs", "0"], "--max-num-seqs 0: Input should be greater than or equal to 1"),
    (["--port", "70000"], "--port 70000: Input should be less than or equal to 65535"),
    (["--kv-cache-gib", "nan"], "--kv-cache-gib nan: Input should be greater than 0"),
    (["--generation-config", "/no/such"], "--generation-config /no/such: '/no/such' is not "
                                          "auto, vllm, none or a directory"),
    (["--generation-config", "/"], "--generation-config /: / holds no "
                                    "generation_config.json"),
    (["--host", ""], "--host '': empty: 127.0.0.1 listens on this machine only, 0.0.0.0 "
                     "(or ::) on every interface"),
    (["--served-model-name", "a", "a"], "--served-model-name a a: served model names must "
                                        "be distinct"),
    (["--allow-credentials"], "--allow-credentials: CORS settings for --allowed-origins"),
    (["--enable-auto-tool-choice", "--tool-call-parser", "none"],
     "--enable-auto-tool-choice needs a tool-call parser (--tool-call-parser auto"),
    (["--config-format", "mistral", "--load-format", "safetensors"],
     "--config-format mistral and --load-format safetensors name different layouts"),
    (["--allowed-origins", "[nope"], "--allowed-origins [nope: a JSON list, or values "
                                     "separated by commas: Expecting value"),
])
def test_a_bad_flag_is_named_with_its_value(argv, want, monkeypatch) -> None:
    assert _error(argv).startswith(want), _error(argv)


@pytest.mark.parametrize(("var", "value", "want"), [
    ("FP8SERVE_MAX_NUM_SEQS", "abc", "FP8SERVE_MAX_NUM_SEQS='abc': Input should be a valid "
                                     "integer"),
    ("FP8SERVE_ENABLE_PREFIX_CACHING", "maybe", "FP8SERVE_ENABLE_PREFIX_CACHING='maybe': "
                                                "expected true or false (1/0, yes/no, on/off)"),
    ("FP8SERVE_SCHEDULING_POLICY", "lifo", "FP8SERVE_SCHEDULING_POLICY='lifo': Input should "
                                           "be 'fcfs' or 'priority'"),
    # an empty host bound every interface, with a warning about 'listening on  '
    ("FP8SERVE_HOST", "", "FP8SERVE_HOST='': empty: 127.0.0.1 listens on this machine"),
    # one item of a list is wrong: the variable's whole value is shown, not the item
    ("FP8SERVE_ALLOWED_ORIGINS", '["a", 1]', 'FP8SERVE_ALLOWED_ORIGINS=\'["a", 1]\': Input '
                                             "should be a valid string"),
    # the check's own words named the flag; the value came from the environment
    ("FP8SERVE_LIMIT_MM_PER_PROMPT", "video=1", "FP8SERVE_LIMIT_MM_PER_PROMPT='video=1': "
                                                "only image is supported"),
])
def test_a_bad_environment_variable_is_named_with_its_value(var, value, want,
                                                            monkeypatch) -> None:
    monkeypatch.setenv(var, value)
    assert _error([]).startswith(want), _error([])


def test_the_flag_wins_and_is_the_one_named(monkeypatch) -> None:
    monkeypatch.setenv("FP8SERVE_MAX_QUEUE", "4")
    assert _error(["--max-queue", "-1"]).startswith("--max-queue -1: ")


def test_secrets_are_named_but_never_shown(monkeypatch) -> None:
    assert _error(["--api-key", " padded-key "]) == (
        "--api-key: API keys must be non-empty and without surrounding spaces")
    monkeypatch.setenv("FP8SERVE_THINKING_SIGNATURE_KEY", "short-secret")
    msg = _error([])
    assert msg.startswith("FP8SERVE_THINKING_SIGNATURE_KEY: ") and "short-secret" not in msg
    monkeypatch.delenv("FP8SERVE_THINKING_SIGNATURE_KEY")
    monkeypatch.setenv("FP8SERVE_API_KEYS", "[sk-secret")
    msg = _error([])
    assert msg.startswith("FP8SERVE_API_KEYS: a JSON list") and "sk-secret" not in msg


def test_every_settings_field_with_a_flag_is_named_by_it() -> None:
    """flag_name spells each flag `fp8serve serve` has for a Settings field."""
    from service.settings import Settings

    serve = next(a for a in build_parser()._subparsers._group_actions[0].choices.items()
                 if a[0] == "serve")[1]
    flags = {s for a in serve._actions for s in a.option_strings}
    env_only = {"thinking_signature_key"}
    for field in Settings.model_fields:
        if field not in env_only:
            assert flag_name(field) in flags, field
        assert env_name(field) == "FP8SERVE_" + field.upper()


def test_the_process_exits_with_one_line_naming_the_variable(tmp_path) -> None:
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parents[2]),
           "FP8SERVE_MAX_NUM_SEQS": "zero"}
    proc = subprocess.run([sys.executable, "-m", "cli.main", "serve", "--model",
                           str(tmp_path)], capture_output=True, text=True, timeout=120,
                          env=env)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr == ("fp8serve: error: FP8SERVE_MAX_NUM_SEQS='zero': Input should be "
                           "a valid integer, unable to parse string as an integer\n")
