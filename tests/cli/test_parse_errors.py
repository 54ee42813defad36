"""A command line argparse refuses is two lines on stderr, exit status 2: the error (an
unknown flag with the nearest known one) and where the flags are listed. It printed the
command's whole usage first (`fp8serve serve`'s: 45 lines above the error)."""

from __future__ import annotations

import pytest

from cli.main import main


def _refused(argv: list[str], capsys) -> list[str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 2
    return capsys.readouterr().err.splitlines()


def test_an_unknown_flag_names_the_nearest_known_one(capsys) -> None:
    assert _refused(["serve", "--max-num-seqz=4", "--kv-cache-gb=1"], capsys) == [
        "fp8serve: error: unrecognized arguments: --max-num-seqz=4 --kv-cache-gb=1 (did you "
        "mean --max-num-seqs, --kv-cache-gib?)",
        "fp8serve COMMAND --help lists the flags"]


def test_a_flag_nothing_is_near_gets_no_guess(capsys) -> None:
    assert _refused(["generate", "--prompt", "hi", "--zzzzzzzz"], capsys)[0] == (
        "fp8serve: error: unrecognized arguments: --zzzzzzzz")


def test_a_bad_value_is_the_subcommands_error_without_its_usage(capsys) -> None:
    assert _refused(["serve", "--port", "abc"], capsys) == [
        "fp8serve serve: error: argument --port: invalid int value: 'abc'",
        "fp8serve serve --help lists the flags"]


@pytest.mark.parametrize("argv,flag", [
    (["serve", "--max-num=4"], "--max-num=4 (did you mean --max-num-seqs?)"),
    (["bench", "kernels", "--quic"], "--quic (did you mean --quick?)"),
    (["kernels", "--log-lev", "DEBUG"], "--log-lev DEBUG (did you mean --log-level?)"),
])
def test_a_prefix_of_a_flag_is_refused_not_taken_for_it(argv, flag, capsys) -> None:
    """argparse takes any unambiguous prefix of a flag; here a flag is taken whole only, in
    every subcommand, so a typo never lands on the flag it begins."""
    err = _refused(argv, capsys)[0]
    assert err.startswith("fp8serve") and flag in err, err
