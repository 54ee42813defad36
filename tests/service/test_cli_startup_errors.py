"""A bad checkpoint stops `fp8serve serve` / `fp8serve generate` at startup: non-zero exit,
one line naming the file and the tensor, no traceback, and the port never opens."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

Q_SCALE = "model.layers.1.self_attn.q_proj.weight_scale_inv"


@pytest.fixture(scope="module")
def nan_scale_checkpoint(tiny_checkpoint, tmp_path_factory) -> Path:
    bad = tmp_path_factory.mktemp("bad") / "ckpt"
    shutil.copytree(tiny_checkpoint(tokenizer=True), bad)
    tensors = load_file(str(bad / "model.safetensors"))
    tensors[Q_SCALE] = torch.tensor(float("nan"), dtype=torch.bfloat16)
    save_file(tensors, str(bad / "model.safetensors"), metadata={"format": "pt"})
    return bad


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])


@pytest.mark.parametrize("command", [
    ("serve", "--port", "0"),
    ("generate", "--prompt", "hello", "--max-tokens", "2"),
])
def test_bad_checkpoint_is_one_line_and_nonzero_exit(command, nan_scale_checkpoint) -> None:
    proc = _run(*command, "--model", str(nan_scale_checkpoint))
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("fp8serve: error:")]
    assert len(errors) == 1, proc.stderr
    assert f"model.safetensors: tensor '{Q_SCALE}': scale is NaN" in errors[0]
    assert "Uvicorn running" not in proc.stderr


def test_missing_model_directory(tmp_path) -> None:
    """A path that is not there 'does not exist' (it said 'not a directory', as for a
    file)."""
    (tmp_path / "file").write_text("x")
    for name, why in (("nope", "does not exist"), ("file", "not a directory")):
        proc = _run("serve", "--model", str(tmp_path / name))
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr == f"fp8serve: error: --model {tmp_path / name}: {why}\n"


@pytest.mark.parametrize("command", [
    ("serve", "--port", "0"),
    ("generate", "--prompt", "hello", "--max-tokens", "2"),
])
def test_a_tokenizer_with_ids_past_the_model_fails_at_startup(command, tiny_checkpoint,
                                                               tmp_path) -> None:
    """An added token beyond the model's vocab_size: each prompt holding it failed inside
    the model (a traceback, a 500 per request); now the start names the tokenizer file."""
    import json

    bad = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint(tokenizer="hf"), bad)
    tok = json.loads((bad / "tokenizer.json").read_text())
    tok["added_tokens"].append({"id": 5000, "content": "<zz>", "single_word": False,
                                "lstrip": False, "rstrip": False, "normalized": False,
                                "special": False})
    (bad / "tokenizer.json").write_text(json.dumps(tok))
    proc = _run(*command, "--model", str(bad))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("fp8serve: error:")]
    assert len(errors) == 1 and "tokenizer.json: ids up to" in errors[0], proc.stderr
    assert "vocab_size is 1024" in errors[0] and "Uvicorn running" not in proc.stderr


def test_generate_names_what_is_wrong_with_the_model_path(tmp_path) -> None:
    """A file is 'not a directory' (it said 'does not exist'); an empty directory lacks
    its config (it said there was no tokenizer)."""
    (tmp_path / "file").write_text("x")
    (tmp_path / "empty").mkdir()
    for model, words in (("file", "is not a directory"), ("empty", "config.json: missing")):
        proc = _run("generate", "--model", str(tmp_path / model), "--prompt", "hi")
        assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
        assert words in proc.stderr, proc.stderr


@pytest.mark.parametrize("command", [
    ("serve", "--port", "0"),
    ("generate", "--prompt", "hello", "--max-tokens", "2"),
])
def test_an_isa_naming_no_level_stops_the_start(command, tiny_checkpoint) -> None:
    """FP8SERVE_ISA=avx-2 was warned about by the extension and ignored: the kernels ran
    at the host's level. Now the start ends naming the variable and the levels."""
    import os

    proc = subprocess.run([sys.executable, "-m", "cli.main", *command, "--model",
                           str(tiny_checkpoint(tokenizer=True))], capture_output=True,
                          text=True, timeout=300, cwd=Path(__file__).resolve().parents[2],
                          env={**os.environ, "FP8SERVE_ISA": "avx-2"})
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "ignored" not in proc.stderr and "Uvicorn running" not in proc.stderr
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("fp8serve: error:")]
    assert errors == ["fp8serve: error: FP8SERVE_ISA='avx-2': one of scalar, avx2, avx512, "
                      "avx512_vbmi, amx (unset: this host's best level)"], proc.stderr
