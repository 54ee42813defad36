"""`fp8serve generate`: an empty prompt and contradicting flags are one-line errors, and
Ctrl-C ends the streamed text's line (the shell prompt then starts on its own) with exit
status 130 and no traceback."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def test_empty_prompt_is_a_one_line_error(tiny_checkpoint, capsys) -> None:
    model = tiny_checkpoint(tokenizer="hf")  # tokenizer.json: no BOS, "" is 0 tokens
    # was an index_select RuntimeError traceback from the model's first step
    assert main(["generate", "--model", str(model), "--prompt", "", "--threads", "1"]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == ("fp8serve: error: --prompt: the prompt is empty "
                                            "(0 tokens)")


@pytest.mark.parametrize(("flags", "want"), [
    (["--max-tokens", "0"], "--max-tokens 0: must be >= 1, got 0"),
    (["--top-p", "5"], "--top-p 5.0: must be in (0, 1], got 5.0"),
    (["--temperature", "-1"], "--temperature -1.0: must be a finite number >= 0, got -1.0"),
])
def test_a_sampling_flag_out_of_range_is_named_as_a_flag(flags, want, tmp_path,
                                                         capsys) -> None:
    """It named the request field (max_tokens: ...), not the flag; checked before the
    model loads (tmp_path holds none)."""
    assert main(["generate", "--model", str(tmp_path), "--prompt", "hi", *flags]) == 1
    assert capsys.readouterr().err == f"fp8serve: error: {want}\n"


def test_system_with_a_raw_prompt_is_refused(tmp_path, capsys) -> None:
    # --system was silently dropped with --prompt (it applies to --chat)
    assert main(["generate", "--model", str(tmp_path), "--prompt", "hi", "--system",
                 "be brief"]) == 1
    assert "--system applies to --chat only" in capsys.readouterr().err


def test_ctrl_c_ends_the_line_and_exits_130(tiny_checkpoint) -> None:
    model = tiny_checkpoint(tokenizer=True)
    proc = subprocess.Popen(
        [sys.executable, "-m", "cli.main", "generate", "--model", str(model), "--prompt",
         "hello", "--ignore-eos", "--max-tokens", "20000", "--max-model-len", "20100",
         "--threads", "1"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        # SIGINT as a terminal sends it, even where the test runner ignores it
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        assert proc.stdout is not None
        first = proc.stdout.read(1)  # the stream has begun
        assert first, proc.stderr.read().decode() if proc.stderr else ""
        time.sleep(0.2)
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    out, err_text = first + out, err.decode()
    assert proc.returncode == 130, err_text
    assert out.endswith(b"\n") and len(out) > 1
    assert "Traceback" not in err_text and "[interrupted]" in err_text


def test_threads_past_the_cpus_are_refused_as_serve_refuses_them(tmp_path, capsys) -> None:
    cpus = len(os.sched_getaffinity(0))
    n = cpus + 1
    why = f"{n} threads, but this process may use {cpus} CPUs"
    # was accepted (serve refused it): a pool of more threads than cores
    assert main(["generate", "--model", str(tmp_path), "--prompt", "hi", "--threads",
                 str(n)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == f"fp8serve: error: --threads {n}: {why}"
    assert main(["serve", "--model", str(tmp_path), "--threads", str(n)]) == 1
    assert capsys.readouterr().err.strip().splitlines()[-1].endswith(why)


def test_the_default_max_model_len_fits_the_checkpoint(tiny_checkpoint, capsys,
                                                       caplog) -> None:
    """4096 on every checkpoint: one with 512 positions warned on every run that positions
    past 512 are beyond its training, and a prompt could run past them. Now serve's
    default: 4096, or the checkpoint's max_position_embeddings where smaller."""
    model = str(tiny_checkpoint(tokenizer=True))  # max_position_embeddings 512
    assert main(["generate", "--model", model, "--prompt", "hi", "--max-tokens", "600"]) == 1
    assert capsys.readouterr().err.endswith("+ max_tokens exceeds --max-model-len 512\n")
    assert main(["generate", "--model", model, "--prompt", "hi", "--max-tokens", "2",
                 "--threads", "1"]) == 0
    assert "max_position_embeddings" not in caplog.text
    assert main(["generate", "--model", model, "--prompt", "hi", "--max-tokens", "600",
                 "--max-model-len", "1024", "--threads", "1"]) == 0  # the flag still wins
    assert "exceeds the model's max_position_embeddings 512" in caplog.text
