"""The result of one timed generation, shared by fp8serve's runner, the baselines and the
rounds that interleave them (bench/generate/run.py, baselines.py, rounds.py)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any


@dataclass(frozen=True)
class GenTiming:
    """One greedy generation: prefill = prompt forward + first token; decode = the rest."""

    prompt_tokens: int
    prefill_s: float
    decode_steps: int
    decode_s: float
    output_ids: tuple[int, ...] = field(default=(), repr=False)

    @property
    def prefill_tps(self) -> float:
        return self.prompt_tokens / self.prefill_s

    @property
    def decode_tps(self) -> float:
        return self.decode_steps / self.decode_s

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"prefill_tok_s": self.prefill_tps,
                               "decode_tok_s": self.decode_tps,
                               "output_ids": list(self.output_ids)}
