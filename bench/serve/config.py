"""What one serving-benchmark pass is asked to do, shared by the client, the passes, the
summaries and the command line (bench/serve/client.py, passes.py, report.py, cli.py)."""

from __future__ import annotations

from dataclasses import dataclass

from bench.serve.workloads import TEXT_WORKLOADS, WORKLOADS


@dataclass(frozen=True)
class BenchConfig:
    url: str
    concurrency: int = 1
    num_prompts: int = 16  # requests; conversations for multi-turn
    input_len: int = 128
    output_len: int = 64
    model: str | None = None  # None: the first of GET /v1/models
    api_key: str | None = None
    seed: int = 0
    vocab_lo: int = 1000  # prompt ids drawn from [vocab_lo, vocab_hi)
    vocab_hi: int = 20000
    workload: str = "random"  # one of workloads.WORKLOADS
    system_len: int = 500  # multi-turn, shared-prefix: the system prompt's ids
    turns: int = 4  # multi-turn: turns per conversation
    round: int = 0  # which round of the run (passes.plan); the random workload's prompts
    # differ per round and concurrency level, so no server finds a prompt it has seen
    chat: bool = False  # text workloads: /v1/chat/completions with the messages
    prediction: str | None = None  # with chat: every request's predicted output

    def endpoint(self, path: str) -> str:
        """The server URL + path ("/v1/...")."""
        return self.url.rstrip("/") + path

    def __post_init__(self) -> None:
        for name in ("concurrency", "num_prompts", "input_len", "output_len", "system_len",
                     "turns"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if self.workload not in WORKLOADS:
            raise ValueError(f"workload must be one of {', '.join(WORKLOADS)}")
        if self.chat and self.workload not in TEXT_WORKLOADS:
            raise ValueError("chat requests need a text workload (grounded, code-edit, story)")
        if self.prediction is not None and not self.chat:
            raise ValueError("a prediction rides on chat requests")
        if self.workload == "shared-prefix" and self.num_prompts < 2:
            raise ValueError("shared-prefix needs num_prompts >= 2 (one warms the cache)")
