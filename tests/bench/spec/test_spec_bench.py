"""`fp8serve bench generate --speculative-config` on the demo model: plain and speculative
passes through the engine give the same greedy outputs, the figures are the quotients of
what was measured, the table prints. Never asserts on timings (the machine is shared)."""

from __future__ import annotations

import argparse
import json

import pytest

from bench.common.errors import BenchError
from bench.generate.cli import run
from bench.spec.run import SpecBenchConfig
from bench.spec.workloads import WORKLOADS, workload_messages
from engine.demo_model import ensure_demo_model
from engine.spec.config import SpeculativeConfig

SPEC = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}'


def _args(out, **kw):
    base = dict(model=None, gen_len=32, threads=None, speculative_config=SPEC,
                workloads="code-edit", concurrency=[1, 2], rounds=1, json=out, prediction=None)
    return argparse.Namespace(**(base | kw))


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    ensure_demo_model()
    out = tmp_path_factory.mktemp("spec") / "spec.json"
    assert run(_args(out)) == 0
    return json.loads(out.read_text())


def test_rows_cover_each_workload_and_concurrency(result, capsys):
    rows = {(r["workload"], r["concurrency"]): r for r in result["rows"]}
    assert set(rows) == {("code-edit", 1), ("code-edit", 2)}
    for r in rows.values():
        assert r["outputs_identical"] is True
        assert r["speedup"] == pytest.approx(r["spec_decode_tok_s"] / r["plain_decode_tok_s"])
        plain, = r["passes"]["off"]
        assert plain["tokens_per_seq_step"] == pytest.approx(1.0)  # one token per step
        s = r["spec"]
        assert 0 <= s["num_accepted_tokens"] <= s["num_draft_tokens"]
        assert sum(s["accepted_per_pos"]) == s["num_accepted_tokens"]
        assert r["tokens_per_seq_step"] >= 1.0
    # returning a given function is where drafts are kept
    assert rows[("code-edit", 1)]["spec"]["num_accepted_tokens"] > 0
    assert result["config"]["spec"]["num_speculative_tokens"] == 3


def test_workload_prompts_and_config_checks():
    assert workload_messages("grounded", 0) != workload_messages("grounded", 1)
    assert set(WORKLOADS) == {"grounded", "code-edit", "story"}
    with pytest.raises(ValueError, match="unknown workload"):
        workload_messages("poem")
    spec = SpeculativeConfig.parse(SPEC)
    with pytest.raises(ValueError, match="unknown workload"):
        SpecBenchConfig(model_dir=ensure_demo_model(), spec=spec, workloads=("poem",))


def test_replay_proposer_drafts_the_reference_while_the_output_follows_it():
    from bench.spec.run import ReplayProposer
    from engine.spec.proposer import DraftInput

    prop = ReplayProposer({(1, 2): [5, 6, 7, 8]})
    assert prop.propose([DraftInput(0, (1, 2), (), 2), DraftInput(1, (1, 2), (5, 6), 9),
                         DraftInput(2, (1, 2), (5, 9), 2), DraftInput(3, (3,), (), 2)]) == [
        (5, 6), (7, 8), (), ()]  # diverged, or an unknown prompt: nothing
    wrong = ReplayProposer({(1, 2): [5, 6, 7, 8]}, wrong=True)
    assert wrong.propose([DraftInput(0, (1, 2), (5,), 2)]) == [(7, 6)]  # 6 ^ 1, 7 ^ 1


def test_oracle_passes_keep_every_draft_or_none(tmp_path):
    out = tmp_path / "oracle.json"
    assert run(_args(out, concurrency=[1], workloads="story", spec_oracle="right")) == 0
    row, = json.loads(out.read_text())["rows"]
    s = row["spec"]
    assert row["outputs_identical"] is True and s["num_draft_tokens"] > 0
    assert s["num_accepted_tokens"] == s["num_draft_tokens"]  # replayed: always right
    assert row["tokens_per_seq_step"] > 1.5
    assert run(_args(out, concurrency=[1], workloads="story", spec_oracle="wrong")) == 0
    row, = json.loads(out.read_text())["rows"]
    s = row["spec"]
    assert row["outputs_identical"] is True and s["num_drafts"] > 0
    assert s["num_accepted_tokens"] == 0 and row["tokens_per_seq_step"] == 1.0
    with pytest.raises(ValueError, match="oracle"):
        SpecBenchConfig(model_dir=ensure_demo_model(), spec=SpeculativeConfig.parse(SPEC),
                        oracle="maybe")


@pytest.mark.parametrize("bad", ['{"method": "ngram"}', "{", "null"])
def test_bad_speculative_config_is_a_cli_error(bad, tmp_path):
    with pytest.raises(BenchError):
        run(_args(tmp_path / "x.json", speculative_config=bad))


def test_prediction_passes_keep_outputs_and_count_prediction_tokens(tmp_path, capsys):
    out = tmp_path / "prediction.json"
    assert run(_args(out, speculative_config=None, prediction="answer", concurrency=[2],
                     workloads="code-edit")) == 0
    row, = json.loads(out.read_text())["rows"]
    s = row["spec"]
    assert row["outputs_identical"] is True
    # the plain pass's own output: every drafted prediction token is kept
    assert s["num_prediction_tokens"] == s["num_draft_tokens"] > 0
    assert s["num_accepted_prediction_tokens"] == s["num_prediction_tokens"]
    assert row["tokens_per_seq_step"] > 2
    assert "predicted outputs (answer" in capsys.readouterr().out


def test_prediction_config_checks():
    model = ensure_demo_model()
    with pytest.raises(ValueError, match="no text to predict"):
        SpecBenchConfig(model_dir=model, spec=None, workloads=("story",), prediction="text")
    with pytest.raises(ValueError, match="speculative config or a prediction"):
        SpecBenchConfig(model_dir=model, spec=None)
    with pytest.raises(ValueError, match="oracle"):
        SpecBenchConfig(model_dir=model, spec=None, prediction="answer", oracle="right")
    args = argparse.Namespace(model=None, gen_len=8, threads=None, speculative_config=None,
                              workloads=None, concurrency=[1], rounds=1, prediction="text")
    from bench.generate.cli import spec_config_from_args
    assert spec_config_from_args(args).workloads == ("grounded", "code-edit")
