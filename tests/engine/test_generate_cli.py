import argparse
import shutil

import pytest
import torch

from cli import generate
from engine.sampling_params import SamplingParams
from engine.text.tokenizer import Tokenizer
from tests.engine.text.tokenizer_fixtures import write_bpe_dir


class ScriptedRunner:
    """Greedy picks script[i] at step i; records the chunks it was given."""

    block_size = 16

    def __init__(self, script, vocab):
        self.script, self.vocab, self.chunks = list(script), vocab, []

    def run(self, batch):
        (chunk,) = batch.chunks
        self.chunks.append(chunk)
        logits = torch.zeros(1, self.vocab)
        logits[0, self.script[len(self.chunks) - 1]] = 10.0
        return logits


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return Tokenizer.from_dir(write_bpe_dir(tmp_path_factory.mktemp("bpe")))


def _run(tok, text_tokens, params, extra=()):
    script = tok.encode(text_tokens, add_special_tokens=False) + list(extra)
    runner = ScriptedRunner(script + [5] * 50, tok.vocab_size)
    pieces = []
    prompt = tok.encode("Q:", add_special_tokens=False)
    stats = generate.stream_generate(runner, tok, prompt, params, pieces.append)
    return stats, pieces, runner


def test_streams_until_eos_with_kv_positions(tok):
    stats, pieces, runner = _run(tok, "Paris is nice", SamplingParams(temperature=0,
                                                                      max_tokens=50), [2])
    assert "".join(pieces) == "Paris is nice"
    assert stats.finish_reason == "stop" and stats.output_tokens == len(runner.chunks)
    first, second = runner.chunks[0], runner.chunks[1]
    assert first.start_pos == 0 and len(first.token_ids) == stats.prompt_tokens
    assert second.start_pos == stats.prompt_tokens and len(second.token_ids) == 1
    assert stats.prefill_s >= 0 and stats.decode_s >= 0


def test_stop_string_and_length(tok):
    stats, pieces, _ = _run(tok, "Paris. The end", SamplingParams(temperature=0, max_tokens=50,
                                                                 stop=(". T",)))
    assert "".join(pieces) == "Paris" and stats.finish_reason == "stop"
    stats, pieces, _ = _run(tok, "Paris is nice", SamplingParams(temperature=0, max_tokens=2))
    assert stats.finish_reason == "length" and stats.output_tokens == 2
    assert "".join(pieces) == tok.decode(tok.encode("Paris is nice")[:2])


def test_ignore_eos(tok):
    stats, _, _ = _run(tok, "", SamplingParams(temperature=0, max_tokens=4, ignore_eos=True),
                       [2, 2])
    assert stats.finish_reason == "length" and stats.output_tokens == 4


def _args(argv):
    parser = argparse.ArgumentParser()
    generate.register(parser.add_subparsers())
    return parser.parse_args(["generate", *argv])


def test_cli_errors_are_one_line(tmp_path):
    from cli.main import CliError

    with pytest.raises(CliError, match="does not exist"):
        generate.run(_args(["--model", str(tmp_path / "nope"), "--prompt", "hi"]))
    with pytest.raises(CliError, match="config.json: missing config"):
        generate.run(_args(["--model", str(tmp_path), "--prompt", "hi"]))
    with pytest.raises(CliError, match="temperature"):
        generate.run(_args(["--model", str(tmp_path), "--prompt", "hi", "--temperature", "-1"]))
    with pytest.raises(SystemExit):  # --prompt and --chat are exclusive
        _args(["--prompt", "a", "--chat", "b"])


def test_cli_end_to_end_on_tiny_checkpoint(tiny_checkpoint, tmp_path, capsys):
    model = tmp_path / "m"
    shutil.copytree(tiny_checkpoint(), model)
    write_bpe_dir(model)
    rc = generate.run(_args(["--model", str(model), "--chat", "Hello", "--max-tokens", "5",
                             "--temperature", "0.7", "--seed", "1", "--threads", "1"]))
    out = capsys.readouterr()
    assert rc == 0 and "tok/s" in out.err and "prompt tokens" in out.err
    rc = generate.run(_args(["--model", str(model), "--chat", "Hello", "--max-tokens", "5",
                             "--temperature", "0.7", "--seed", "1", "--threads", "1"]))
    assert capsys.readouterr().out == out.out  # seeded: same text again
