"""docs/configuration.md is generated from `fp8serve serve`'s parser and the settings: it
must equal what the generator writes now, and every FP8SERVE_* variable the code reads must
be in it."""

import re
from pathlib import Path

import pytest

from cli import serve
from cli.docgen import CONFIGURATION
from cli.docgen.config_doc import flag_rows, render_configuration, serve_parser

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("engine", "service", "ext", "cli")
ENV = re.compile(r"FP8SERVE_[A-Z][A-Z0-9_]*[A-Z0-9]")


def test_the_configuration_doc_is_current():
    assert CONFIGURATION.read_text(encoding="utf-8") == render_configuration(), (
        "docs/configuration.md is stale: run python -m cli.docgen")


def test_a_flag_added_without_regenerating_makes_the_doc_stale(monkeypatch):
    monkeypatch.setattr(serve, "FLAGS", serve.FLAGS + (
        ("--thinking-signature-key", str, "a new flag"),))
    assert "`--thinking-signature-key TEXT`" in render_configuration()
    assert CONFIGURATION.read_text(encoding="utf-8") != render_configuration()


def test_a_flag_without_a_setting_is_refused(monkeypatch):
    monkeypatch.setattr(serve, "FLAGS", serve.FLAGS + (("--no-such-setting", int, "x"),))
    with pytest.raises(ValueError, match="--no-such-setting has no Settings field"):
        flag_rows()


def test_every_serve_flag_is_in_the_doc():
    doc = CONFIGURATION.read_text(encoding="utf-8")
    flags = [s for a in serve_parser()._actions for s in a.option_strings
             if s.startswith("--") and s != "--help"]
    assert len(flags) > 30
    missing = [f for f in flags if f"`{f}" not in doc]
    assert not missing, missing
    assert "--log-level" in flags  # every command's, added by cli/main.py
    positional = [a.metavar for a in serve_parser()._actions if not a.option_strings]
    assert positional == ["MODEL"] and "| `MODEL` (positional) | `FP8SERVE_MODEL` |" in doc


def test_every_environment_variable_the_code_reads_is_documented():
    doc = CONFIGURATION.read_text(encoding="utf-8")
    found = set()
    for top in SOURCES:
        for path in (ROOT / top).rglob("*"):
            if path.suffix in {".py", ".cpp", ".h", ".inc"} and "bench" not in path.name:
                found |= set(ENV.findall(path.read_text(encoding="utf-8")))
    assert {"FP8SERVE_ISA", "FP8SERVE_FUSED", "FP8SERVE_KERNEL"} <= found  # the grep works
    missing = sorted(v for v in found if f"`{v}`" not in doc)
    assert not missing, f"FP8SERVE_* variables read but not in docs/configuration.md: {missing}"
