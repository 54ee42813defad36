"""ModelRunner over BatchInputs: chunked prefill and batched decode equal one-shot prefill,
incremental greedy decoding equals recomputing the prefix, logit-row layout, KV sizing,
and input validation.

Tolerance for "same logits": both sides run the same bf16 kernels; only the attention
shapes differ (chunked / padded-batched SDPA vs one causal SDPA), which changes fp32
summation order inside attention and then bf16 rounding downstream; the logits themselves
are bf16 (one ulp at |logit| 2..4 is 1/64). Measured max error relative to the logit
scale: 1.35e-2 (one or two bf16 ulps of a logit); a wrong position, slot or mask gives
errors of order 1, so 2e-2 separates them.
"""

from __future__ import annotations

import pytest
import torch

from engine.batch import BatchInputs, LogitsWanted, SeqChunk
from engine.model.kv_store import bytes_per_block
from engine.runner import generate_greedy, kernel_line
from tests.engine.test_model_support import (
    logit_error,
    make_runner,
    random_weights,
    tiny_config,
)

SAME = 2e-2
NONE, LAST, ALL = LogitsWanted.NONE, LogitsWanted.LAST, LogitsWanted.ALL


@pytest.fixture(scope="module")
def weights():
    return random_weights(tiny_config(), seed=11)


def _tokens(n: int, seed: int) -> list[int]:
    return torch.randint(0, 320, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _one_shot(weights, ids: list[int]) -> torch.Tensor:
    """[len(ids), V]: logits after every token, one prefill chunk in a fresh runner."""
    runner = make_runner(weights)
    blocks = tuple(range(-(-len(ids) // runner.block_size)))
    return runner.run(BatchInputs((SeqChunk(0, tuple(ids), 0, blocks, ALL),)))


def test_chunked_prefill_and_batched_decode_match_one_shot(weights) -> None:
    runner = make_runner(weights)
    bs = runner.block_size
    lens = {0: 23, 1: 9, 2: 30}
    decode_steps = 4
    seqs = {s: _tokens(n + decode_steps, seed=s) for s, n in lens.items()}
    # interleaved, non-contiguous block tables drawn from a permutation of the store
    perm = torch.randperm(runner.num_kv_blocks, generator=torch.Generator().manual_seed(0))
    need = {s: -(-len(ids) // bs) for s, ids in seqs.items()}
    tables, used = {}, 0
    for s in seqs:
        tables[s] = tuple(int(b) for b in perm[used: used + need[s]].flip(0))
        used += need[s]

    def chunk(s: int, a: int, b: int, want: LogitsWanted) -> SeqChunk:
        return SeqChunk(s, tuple(seqs[s][a:b]), a, tables[s], want)

    got: dict[tuple[int, int], torch.Tensor] = {}  # (seq, position) -> logits row

    def run(chunks: list[SeqChunk]) -> None:
        out = runner.run(BatchInputs(tuple(chunks)))
        assert out.shape == (sum(c.num_logit_rows for c in chunks), 320)
        row = 0
        for c in chunks:
            positions = {NONE: [], LAST: [c.start_pos + c.num_tokens - 1],
                         ALL: list(range(c.start_pos, c.start_pos + c.num_tokens))}[c.logits]
            for p in positions:
                got[(c.seq_id, p)] = out[row]
                row += 1

    run([chunk(0, 0, 10, NONE), chunk(1, 0, 9, LAST), chunk(2, 0, 16, ALL)])
    run([chunk(1, 9, 10, LAST), chunk(0, 10, 23, LAST), chunk(2, 16, 30, LAST)])
    for step in range(decode_steps):
        run([chunk(s, lens[s] + step, lens[s] + step + 1, LAST) for s in (2, 0)]
            + ([chunk(1, 10 + step, 11 + step, LAST)] if step < decode_steps - 1 else []))
    for s, ids in seqs.items():
        ref = _one_shot(weights, ids)
        for (seq, p), row in got.items():
            if seq == s:
                assert logit_error(row[None], ref[p][None]) < SAME, (s, p)
    assert len(got) == 16 + 1 + 1 + 1 + 1 + 2 * decode_steps + (decode_steps - 1)


def test_incremental_greedy_equals_recomputing_the_prefix(weights) -> None:
    prompt = _tokens(12, seed=5)
    runner = make_runner(weights)
    fast = generate_greedy(runner, prompt, max_new_tokens=10)
    slow: list[int] = []
    for _ in range(10):
        logits = _one_shot(weights, prompt + slow)[-1]
        slow.append(int(torch.argmax(logits)))
    assert fast == slow


def test_logit_rows_follow_chunk_order(weights) -> None:
    runner = make_runner(weights)
    a, b = _tokens(6, 1), _tokens(5, 2)
    out = runner.run(BatchInputs((SeqChunk(0, tuple(a), 0, (0, 1), ALL),
                                  SeqChunk(1, tuple(b), 0, (2, 3), NONE),
                                  SeqChunk(2, tuple(b), 0, (4, 5), LAST))))
    assert out.shape == (7, 320)
    ref_a, ref_b = _one_shot(weights, a), _one_shot(weights, b)
    assert logit_error(out[:6], ref_a) < SAME
    assert logit_error(out[6:], ref_b[-1:]) < SAME
    only_fill = runner.run(BatchInputs((SeqChunk(3, tuple(a), 0, (6, 7), NONE),)))
    assert only_fill.shape == (0, 320)


def test_kv_store_sizing(weights) -> None:
    runner = make_runner(weights, kv_cache_gib=0.001, kv_block_size=8)
    c = weights.config
    per_block = 2 * c.num_layers * 8 * c.num_kv_heads * c.head_dim * 2
    assert runner.kv_bytes_per_block == per_block == bytes_per_block(c, 8)
    assert runner.num_kv_blocks == (2**30 // 1000) // per_block
    assert runner.block_size == 8
    assert runner.kv.kv.shape == (c.num_layers, 2, runner.num_kv_blocks, c.num_kv_heads, 8,
                                  c.head_dim)
    # named the field (kv_cache_gib), not the flag
    with pytest.raises(ValueError, match="^--kv-cache-gib 1e-07 holds no KV block"):
        make_runner(weights, kv_cache_gib=1e-7)


def test_invalid_inputs_are_rejected(weights) -> None:
    runner = make_runner(weights, max_model_len=16)
    with pytest.raises(ValueError, match="block_table"):
        runner.run(BatchInputs((SeqChunk(0, (1, 2, 3, 4, 5), 0, (0,)),)))
    with pytest.raises(ValueError, match="outside the KV store"):
        runner.run(BatchInputs((SeqChunk(0, (1, 2), 0, (runner.num_kv_blocks,)),)))
    with pytest.raises(ValueError, match="vocabulary"):
        runner.run(BatchInputs((SeqChunk(0, (1, 320), 0, (0,)),)))
    with pytest.raises(ValueError, match="max_model_len"):
        runner.run(BatchInputs((SeqChunk(0, (1,), 16, tuple(range(5))),)))


def _sdpa_runner(weights):
    """A runner on the reference attention path (SDPA; the C++ op is the default)."""
    runner = make_runner(weights)
    runner.model.attention.use_ext = False
    return runner


def test_decode_reuses_gather_buffers(weights) -> None:
    runner = _sdpa_runner(weights)
    generate_greedy(runner, _tokens(6, 3), max_new_tokens=4)
    bufs = dict(runner.model.attention._buf)
    assert set(bufs) == {"k", "v"}
    generate_greedy(runner, _tokens(6, 4), max_new_tokens=3)
    assert {k: v.data_ptr() for k, v in runner.model.attention._buf.items()} == \
        {k: v.data_ptr() for k, v in bufs.items()}


def test_attention_uses_fused_sdpa_kernels_not_the_math_path(weights) -> None:
    """Prefill (with and without cached context) and batched decode reach torch's fused
    CPU attention kernel; the unfused math fallback materializes [heads, n, L] scores."""
    runner = _sdpa_runner(weights)
    a = _tokens(20, 1)
    with torch.profiler.profile() as prof:
        runner.run(BatchInputs((SeqChunk(0, tuple(a[:12]), 0, (0, 1, 2, 3, 4)),)))
        runner.run(BatchInputs((SeqChunk(0, tuple(a[12:]), 12, (0, 1, 2, 3, 4)),
                                SeqChunk(1, (5, 6), 0, (5,)))))
        runner.run(BatchInputs((SeqChunk(0, (3,), 20, (0, 1, 2, 3, 4, 6)),
                                SeqChunk(1, (4,), 2, (5,)))))
    names = {e.key for e in prof.key_averages()}
    assert "aten::_scaled_dot_product_attention_math" not in names
    assert "aten::_scaled_dot_product_flash_attention_for_cpu" in names


def test_flags_asking_for_more_memory_than_the_host_has_are_refused():
    """--kv-cache-gib 1000 failed with an allocator traceback, --max-model-len 100000000
    drew the OOM killer (its position tables alone are gigabytes): both are refused,
    naming the flags and the sizes, before anything is allocated."""
    from engine.config import ConfigError, EngineConfig, ModelConfig
    from engine.runner import check_memory

    cfg = ModelConfig(architecture="MistralForCausalLM", hidden_size=256,
                      intermediate_size=512, num_layers=2, num_heads=4, num_kv_heads=2,
                      head_dim=64, vocab_size=1024)
    gib = 2**30
    check_memory(cfg, EngineConfig(model_dir=".", kv_cache_gib=1.0), available=2 * gib)
    with pytest.raises(ConfigError, match=r"--kv-cache-gib 1000 and --max-model-len 4096 "
                                          r"need 1000\.0 GiB .* 2\.0 GiB available"):
        check_memory(cfg, EngineConfig(model_dir=".", kv_cache_gib=1000.0), available=2 * gib)
    with pytest.raises(ConfigError, match=r"position tables 59\.6"):
        check_memory(cfg, EngineConfig(model_dir=".", max_model_len=100_000_000),
                     available=2 * gib)
    from engine.memory import available_bytes

    assert available_bytes("/nonexistent/meminfo") is None  # then nothing is checked
    assert available_bytes() > 0  # Linux: MemAvailable


def test_fused_switch_takes_0_or_1_only(monkeypatch) -> None:
    """FP8SERVE_FUSED other than 0 / 1 / unset is an error naming it (it was ignored)."""
    from engine.runner import ModelRunner

    monkeypatch.setenv("FP8SERVE_FUSED", "banana")
    with pytest.raises(ValueError, match="FP8SERVE_FUSED='banana'"):
        ModelRunner(None, None, None, None)  # type: ignore[arg-type]


def test_startup_log_names_each_layers_kernel(weights, caplog) -> None:
    """The startup log says where the linears run (the full report: /kernels)."""
    import logging

    with caplog.at_level(logging.INFO, logger="engine.runner"):
        runner = make_runner(weights, kv_cache_gib=0.001, kv_block_size=8)
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("kernels: ")]
    assert len(lines) == 1
    counts = runner.kernel_report.selected_counts()
    assert lines[0] == "kernels: " + kernel_line(runner.kernel_report)
    for (kernel, _, scale), n in counts.items():
        assert f" on {kernel} (" in lines[0] and f"{scale} {n}" in lines[0]
    total = sum(counts.values())
    assert total == sum(int(p.split(" on ")[0]) for p in lines[0][9:].split("), ")
                        if " on " in p and "generated" not in p)


def test_a_sliding_window_the_context_can_pass_is_refused(weights) -> None:
    """Sliding-window attention is not implemented: a --max-model-len past the window
    would attend keys outside it (transformers masks them), so the server refuses it;
    within the window the plain causal mask is the same mask."""
    from dataclasses import replace

    from engine.config import ConfigError

    windowed = replace(weights, config=replace(weights.config, sliding_window=8))
    with pytest.raises(ConfigError, match="sliding_window is 8: .* --max-model-len 8 or less"):
        make_runner(windowed, kv_cache_gib=0.001, max_model_len=64)
    assert make_runner(windowed, kv_cache_gib=0.001, max_model_len=8).engine_config \
        .max_model_len == 8


def test_a_max_model_len_past_max_position_embeddings_starts_with_a_warning(
        weights, caplog) -> None:
    """As --max-model-len's help says: not refused (vLLM refuses unless
    VLLM_ALLOW_LONG_MAX_MODEL_LEN=1), but logged naming both limits; the rotary tables then
    cover every position up to max_model_len."""
    import logging
    from dataclasses import replace

    short = replace(weights, config=replace(weights.config, max_position_embeddings=16))
    with caplog.at_level(logging.WARNING, logger="engine.runner"):
        runner = make_runner(short, kv_cache_gib=0.001, max_model_len=24)
    assert any("max_model_len 24 exceeds the model's max_position_embeddings 16" in
               r.getMessage() for r in caplog.records)
    assert runner.model.rope.max_positions == 24
    assert generate_greedy(runner, _tokens(20, 3), 3)  # positions 16..22 run


def test_a_forced_kernel_the_host_cannot_run_is_logged_once_not_per_layer(
        weights, caplog) -> None:
    """--kernel naming a kernel this host cannot run: every layer falls down its table,
    and the startup log says so in one line with the number of layers (it was one line per
    layer); each layer's warning stays in the report."""
    import logging

    from engine.hardware import HardwareInfo
    from engine.kernels.registry import KernelOverrides
    from engine.runner import ModelRunner
    from tests.engine.test_model_support import engine_config

    forced = KernelOverrides(forced="cuda_scaled_mm_w8a8")
    with caplog.at_level(logging.DEBUG):
        runner = ModelRunner(weights, engine_config(kv_cache_gib=0.001),
                             HardwareInfo.fake(), forced)
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING
              and "forced kernel cuda_scaled_mm_w8a8" in r.getMessage()]
    fp8 = [c for c in runner.kernel_report.choices.values() if c.warning]
    assert len(fp8) == 4 * weights.config.num_layers  # qkv, o, gate_up, down: each FP8 one
    assert {c.warning for c in fp8} == {fp8[0].warning} and "no CUDA device" in fp8[0].warning
    assert warned == [f"{fp8[0].warning}: {len(fp8)} layers ({fp8[0].layer}, ...)"]


@pytest.mark.parametrize("mode,seqs,on", [("auto", 1, True), ("auto", 2, False),
                                          ("on", 16, True), ("off", 1, False)])
def test_engine_config_rows_by_role(mode, seqs, on) -> None:
    """--rows-by-role auto splits rows by role only for an engine of one sequence without
    speculative decoding (whose drafts are verified several rows at once); on forces it."""
    from engine.config import EngineConfig
    from engine.spec.config import SpeculativeConfig

    assert EngineConfig(model_dir=".", max_num_seqs=seqs, rows_by_role=mode).rows_by_role_on is on
    spec = SpeculativeConfig.parse('{"method": "ngram", "num_speculative_tokens": 4}')
    drafted = EngineConfig(model_dir=".", max_num_seqs=seqs, rows_by_role=mode,
                           speculative_config=spec)
    assert drafted.rows_by_role_on is (mode == "on")


def test_engine_config_rejects_an_unknown_rows_by_role() -> None:
    from engine.config import ConfigError, EngineConfig

    with pytest.raises(ConfigError, match="rows_by_role 'sometimes' is not one of auto, on, off"):
        EngineConfig(model_dir=".", rows_by_role="sometimes")


def test_serve_flag_and_environment_set_rows_by_role(monkeypatch) -> None:
    """--rows-by-role and FP8SERVE_ROWS_BY_ROLE reach the settings (auto by default); a
    value outside auto, on, off is refused."""
    import argparse

    from pydantic import ValidationError

    from cli import serve
    from service.settings import Settings

    assert Settings().rows_by_role == "auto"
    monkeypatch.setenv("FP8SERVE_ROWS_BY_ROLE", "off")
    assert Settings().rows_by_role == "off"
    with pytest.raises(ValidationError):
        Settings(rows_by_role="sometimes")
    p = argparse.ArgumentParser()
    serve.register(p.add_subparsers())
    args = p.parse_args(["serve", "--rows-by-role", "on"])
    assert serve.settings_from_args(args).rows_by_role == "on"
