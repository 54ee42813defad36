"""`fp8serve demo-model DIR` and `fp8serve synth-model --out DIR` never destroy what is
already at DIR: a file, another checkpoint, other files. Each refuses with one line and
exit status 1 (demo-model before converting anything)."""

from __future__ import annotations

import pytest

from cli.main import main


def _one_error_line(err: str) -> str:
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("fp8serve: error: "), err
    assert "Traceback" not in err
    return lines[0]


def test_demo_model_keeps_a_file_at_dir(tmp_path, capsys) -> None:
    target = tmp_path / "notes.txt"
    target.write_text("keep me")
    assert main(["demo-model", str(target)]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert str(target) in line and "not a directory" in line
    assert target.read_text() == "keep me"  # was replaced by a checkpoint directory


def test_demo_model_keeps_a_directory_of_other_files(tmp_path, capsys) -> None:
    target = tmp_path / "mine"
    target.mkdir()
    (target / "data.csv").write_text("1,2\n")
    assert main(["demo-model", str(target)]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert str(target) in line and "not empty" in line
    assert [p.name for p in target.iterdir()] == ["data.csv"]  # was deleted


def test_synth_model_refuses_a_non_empty_out(tmp_path, capsys) -> None:
    out = tmp_path / "ckpt"
    assert main(["synth-model", "--shape", "tiny", "--out", str(out),
                 "--tokenizer", "none"]) == 0
    before = sorted(p.name for p in out.iterdir())
    capsys.readouterr()
    # a native layout written over the Hugging Face one left both, read as the old one
    assert main(["synth-model", "--shape", "tiny", "--out", str(out), "--layout", "native",
                 "--tokenizer", "none"]) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert f"--out {out}" in line and "not empty" in line
    assert sorted(p.name for p in out.iterdir()) == before
    file_out = tmp_path / "file"
    file_out.write_text("x")
    assert main(["synth-model", "--shape", "tiny", "--out", str(file_out)]) == 1
    assert "not a directory" in _one_error_line(capsys.readouterr().err)


def test_synth_model_writes_into_an_empty_directory(tmp_path) -> None:
    assert main(["synth-model", "--shape", "tiny", "--out", str(tmp_path),
                 "--tokenizer", "none"]) == 0
    assert (tmp_path / "config.json").is_file()


def test_synth_model_native_vision_needs_the_native_layout(tmp_path, capsys) -> None:
    assert main(["synth-model", "--shape", "tiny", "--out", str(tmp_path / "a"),
                 "--native-vision"]) == 1  # was ignored: an hf-text checkpoint, no vision
    assert "--native-vision needs --layout native" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("flag", ["--layers", "--shard-mb", "--original-max-pos"])
def test_synth_model_sizes_must_be_positive(flag, tmp_path, capsys) -> None:
    # --original-max-pos 0 wrote a checkpoint that serve and generate refuse to load
    with pytest.raises(SystemExit) as exc:
        main(["synth-model", "--shape", "tiny", "--out", str(tmp_path / "a"), flag, "0"])
    assert exc.value.code == 2
    assert f"argument {flag}: must be >= 1, got 0" in capsys.readouterr().err
    assert not (tmp_path / "a").exists()
