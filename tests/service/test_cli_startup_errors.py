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
    proc = _run("serve", "--model", str(tmp_path / "nope"))
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "not a directory" in proc.stderr
