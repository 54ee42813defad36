"""`fp8serve bench ...`: the flags the benchmarks share and their bad values end as one
line naming the flag or file, exit status 1 (argparse's own: 2), before anything is
measured; never a traceback, never a silent default."""

from __future__ import annotations

import pytest

from cli.main import main


def _error(capsys) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err
    lines = [ln for ln in err.splitlines() if ln.startswith("fp8serve")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize("bench", [
    ["lm-head", "--random-prompts"],  # was torch.set_num_threads' RuntimeError traceback
    ["structured"],  # ran on every core
    ["rss"],  # ran on every core
    ["generate", "--baselines", ""],  # was a traceback
])
def test_threads_must_be_positive(bench, tiny_checkpoint, capsys) -> None:
    assert main(["bench", *bench, "--model", str(tiny_checkpoint()), "--threads", "0"]) == 1
    assert _error(capsys) == "fp8serve: error: --threads 0: must be >= 1"


@pytest.mark.parametrize("bench", [["kv-cache"], ["lm-head"], ["structured"],
                                   ["generate", "--baselines", ""]])
def test_a_directory_that_is_no_checkpoint(bench, tmp_path, capsys) -> None:
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    # was engine.checkpoint.errors.CheckpointError's traceback
    assert main(["bench", *bench, "--model", str(tmp_path), "--threads", "1"]) == 1
    assert "missing config" in _error(capsys)


def test_vision_missing_model_is_one_line(tmp_path, capsys) -> None:
    assert main(["bench", "vision", "--model", str(tmp_path / "nope")]) == 1
    assert "not a directory" in _error(capsys)


def test_output_paths_are_checked_before_the_run(tmp_path, capsys) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    # was FileExistsError's traceback, after the whole benchmark had run
    assert main(["bench", "serve", "--url", "http://127.0.0.1:9", "--json-out",
                 str(blocker / "serve.json")]) == 1
    assert _error(capsys) == (f"fp8serve: error: --json-out {blocker / 'serve.json'}: "
                              f"{blocker} is not a directory")
    assert main(["bench", "kernels", "--json", str(tmp_path)]) == 1
    assert _error(capsys) == f"fp8serve: error: --json {tmp_path}: is a directory"


def test_structured_gen_len_zero_is_refused(tiny_checkpoint, capsys) -> None:
    # 0 was taken as "not given": the default 48 ran
    assert main(["bench", "structured", "--model", str(tiny_checkpoint()), "--gen-len", "0",
                 "--threads", "1"]) == 1
    assert _error(capsys) == "fp8serve: error: --gen-len 0: must be >= 4"


def test_structured_speculation_flags_need_speculation(tiny_checkpoint, capsys) -> None:
    assert main(["bench", "structured", "--model", str(tiny_checkpoint()), "--workloads",
                 "bogus"]) == 1  # was ignored
    assert _error(capsys).endswith("--workloads applies with --speculative-config only")


@pytest.mark.parametrize("flag", ["--bandwidth-passes", "--bandwidth-mib"])
def test_generate_bandwidth_probe_flags(flag, tiny_checkpoint, capsys) -> None:
    assert main(["bench", "generate", "--model", str(tiny_checkpoint()), "--baselines", "",
                 flag, "0"]) == 1  # --bandwidth-passes 0 was a ValueError traceback
    assert _error(capsys) == f"fp8serve: error: {flag} 0: must be >= 1"


def test_vision_sizes_and_rounds(tiny_checkpoint, capsys) -> None:
    with pytest.raises(SystemExit) as exc:  # was PIL's "cannot write empty image"
        main(["bench", "vision", "--model", "x", "--sizes", "0x64"])
    assert exc.value.code == 2
    assert "width and height must be >= 1" in capsys.readouterr().err
    # --compare-unfused --rounds 0 was a KeyError traceback
    assert main(["bench", "vision", "--model", str(tiny_checkpoint()), "--compare-unfused",
                 "--rounds", "0"]) == 1
    assert _error(capsys) == "fp8serve: error: --rounds 0: must be >= 1"


def test_kv_cache_contexts_names_the_flag(tiny_checkpoint, capsys) -> None:
    assert main(["bench", "kv-cache", "--model", str(tiny_checkpoint()), "--contexts",
                 "512,x"]) == 1  # was "invalid literal for int() with base 10: 'x'"
    assert _error(capsys) == ("fp8serve: error: --contexts: expected a comma list of "
                              "integers, got '512,x'")


def test_kernels_table_says_what_its_columns_are(tmp_path, capsys) -> None:
    assert main(["bench", "kernels", "--quick", "--shapes", "64x128", "--m", "1",
                 "--kernels", "torch_w8a16", "--scaled-mm-m", "", "--json",
                 str(tmp_path / "k.json"), "--png", str(tmp_path / "k.png")]) == 0
    out = capsys.readouterr().out
    assert "x bf16, x smm: torch bf16 matmul's / torch._scaled_mm's time over this " \
           "kernel's, > 1 faster" in out
    # was "torch._scaled_mm measured only at M in [] ..."
    assert "torch._scaled_mm not measured" in out and "M in []" not in out


@pytest.mark.parametrize(("bench", "message"), [
    # were "num_prompts must be >= 1", "concurrency must be >= 1", "shared-prefix needs
    # num_prompts >= 2 ...": the config's field names, not the flags
    (["serve", "--num-prompts", "0"], "--num-prompts 0: must be >= 1"),
    (["serve", "--concurrency", "1", "0"], "--concurrency 0: must be >= 1"),
    (["serve", "--output-len", "-3"], "--output-len -3: must be >= 1"),
    (["serve", "--workload", "shared-prefix", "--num-prompts", "1"],
     "--num-prompts 1: --workload shared-prefix needs >= 2 (the first warms the cache)"),
    (["serve", "--rounds", "0"], "--rounds 0: must be >= 1"),
    # was "token counts, prompts and rounds must be >= 1"
    (["lm-head", "MODEL", "--prompts", "0"], "--prompts 0: must be >= 1"),
    (["lm-head", "MODEL", "--speed-rounds", "0"], "--speed-rounds 0: must be >= 1"),
    # was "need kv_cache_gib > 0 and requests, concurrency, prompt_len, max_tokens >= 1"
    (["rss", "MODEL", "--kv-cache-gib", "0"], "--kv-cache-gib 0: must be > 0"),
    (["rss", "MODEL", "--prompt-len", "0"], "--prompt-len 0: must be >= 1"),
    # was "rounds, tokens, prompts and contexts must be >= 1"
    (["kv-cache", "MODEL", "--speed-tokens", "0"], "--speed-tokens 0: must be >= 1"),
    (["kv-cache", "MODEL", "--greedy-tokens", "-1"], "--greedy-tokens -1: must be >= 0"),
    (["kv-cache", "MODEL", "--contexts", "512,0"],
     "--contexts 512,0: each context length must be >= 1"),
    # were "need gen_len >= 2, rounds >= 1 and concurrency >= 1", "bad concurrency (0,)"
    # and int()'s "invalid literal"
    (["structured", "MODEL", "--rounds", "0"], "--rounds 0: must be >= 1"),
    (["structured", "MODEL", "--speculative-config", '{"method": "ngram"}', "--gen-len", "1"],
     "--gen-len 1: must be >= 2"),
    (["structured", "MODEL", "--concurrency", "0"], "--concurrency 0: each level must be >= 1"),
    (["structured", "MODEL", "--concurrency", "1,x"],
     "--concurrency 1,x: not a comma-separated list of integers"),
])
def test_range_errors_name_the_flag(bench, message, tiny_checkpoint, tmp_path,
                                    capsys) -> None:
    if bench[0] == "serve":  # refused before the server is reached
        argv = [*bench, "--url", "http://127.0.0.1:9", "--json-out", str(tmp_path / "s.json")]
    else:
        argv = [bench[0], "--model", str(tiny_checkpoint()), *bench[2:], "--json",
                str(tmp_path / "out.json")]
    assert main(["bench", *argv]) == 1
    assert _error(capsys) == f"fp8serve: error: {message}"
