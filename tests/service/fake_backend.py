"""A ModelBackend over the fake runner/tokenizer of tests/engine/fake_runner.py."""

from __future__ import annotations

from engine.checkpoint.generation import SamplingDefaults
from engine.config import EngineConfig
from engine.hardware import HardwareInfo
from service.backend import ModelBackend
from service.settings import Settings
from tests.engine.fake_runner import (
    CacheCheckingRunner,
    FakeDetokenizer,
    FakeKernelReport,
    FakeTokenizer,
)

MODEL = "fake-model"


def fake_loader(delay_s: float = 0.0, num_kv_blocks: int = 64, fail_on_token=None,
                sampling_defaults: SamplingDefaults | None = None):
    def load(settings: Settings) -> ModelBackend:
        runner = CacheCheckingRunner(num_kv_blocks=num_kv_blocks, block_size=4,
                                     fail_on_token=fail_on_token, delay_s=delay_s)
        runner.kernel_report = FakeKernelReport()
        cfg = EngineConfig(model_dir=".", max_num_seqs=settings.max_num_seqs,
                           max_model_len=settings.max_model_len,
                           max_num_batched_tokens=settings.max_num_batched_tokens,
                           max_prefill_tokens_with_decodes=(
                               settings.max_prefill_tokens_with_decodes),
                           scheduling_policy=settings.scheduling_policy)
        hw = HardwareInfo.fake("avx2", "fma")
        return ModelBackend(runner, FakeTokenizer(), MODEL, hw, cfg, FakeDetokenizer,
                            sampling_defaults=sampling_defaults or SamplingDefaults())
    return load
