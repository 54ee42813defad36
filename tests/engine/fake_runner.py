"""Deterministic stand-ins for the model runner, tokenizer and detokenizer.

:class:`CacheCheckingRunner` keeps a fake KV cache: it writes every token it runs into
``cache[block][offset]`` and computes each logits row from what it *reads back* from the
cache for positions 0..pos. If the scheduler handed out overlapping blocks, lost a
sequence's blocks or skipped positions, the outputs differ from :func:`expected_tokens`.
Next token = (sum of all tokens so far + position) % vocab, never EOS (0) unless the sum
says so.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engine.batch import BatchInputs, LogitsWanted
from engine.text.chat_template import normalize_messages

VOCAB = 50


def next_token(seq: list[int]) -> int:
    return (sum(seq) + len(seq)) % VOCAB


def expected_tokens(prompt: list[int], n: int, eos: int | None = None) -> list[int]:
    seq, out = list(prompt), []
    for _ in range(n):
        t = next_token(seq)
        out.append(t)
        seq.append(t)
        if t == eos:
            break
    return out


@dataclass
class CacheCheckingRunner:
    num_kv_blocks: int = 64
    block_size: int = 4
    fail_on_token: int | None = None  # raise whenever a chunk contains this token
    batches: list[BatchInputs] = field(default_factory=list)
    cache: dict[tuple[int, int], int] = field(default_factory=dict)
    delay_s: float = 0.0  # sleep per run() so tests can observe requests in flight
    next_fn: Callable[[list[int]], int] = next_token  # the "model": sequence -> next token
    vocab: int = VOCAB
    # None: rows are -10 except +10 at the next token (sampling is all but greedy); a
    # float: rows are 0 except ``soft`` there, so sampled requests really draw
    soft: float | None = None

    def run(self, batch: BatchInputs) -> torch.Tensor:
        self.batches.append(batch)
        if self.delay_s:
            time.sleep(self.delay_s)
        self._check_disjoint(batch)
        rows = []
        for c in batch.chunks:
            if self.fail_on_token is not None and self.fail_on_token in c.token_ids:
                raise RuntimeError(f"poisoned token {self.fail_on_token}")
            assert len(c.block_table) * self.block_size >= c.start_pos + c.num_tokens
            assert all(0 <= b < self.num_kv_blocks for b in c.block_table)
            for i, t in enumerate(c.token_ids):
                pos = c.start_pos + i
                self.cache[(c.block_table[pos // self.block_size], pos % self.block_size)] = t
            want = {LogitsWanted.NONE: [], LogitsWanted.LAST: [c.num_tokens - 1],
                    LogitsWanted.ALL: list(range(c.num_tokens))}[c.logits]
            for i in want:
                seq = [self.cache[(c.block_table[p // self.block_size], p % self.block_size)]
                       for p in range(c.start_pos + i + 1)]
                row = torch.full((self.vocab,), -10.0 if self.soft is None else 0.0)
                row[self.next_fn(seq)] = 10.0 if self.soft is None else self.soft
                rows.append(row)
        return torch.stack(rows) if rows else torch.empty(0, self.vocab)

    def _check_disjoint(self, batch: BatchInputs) -> None:
        """Sequences may share cached blocks, but a block one chunk writes is in no other
        chunk's table."""
        bs = self.block_size
        for i, c in enumerate(batch.chunks):
            written = {c.block_table[p // bs]
                       for p in range(c.start_pos, c.start_pos + c.num_tokens)}
            for j, other in enumerate(batch.chunks):
                if i != j:
                    assert not written & set(other.block_table), \
                        "a chunk writes a KV block another sequence holds"


def _word_id(word: str) -> int:
    try:
        return int(word) % VOCAB
    except ValueError:
        return zlib.crc32(word.encode("utf-8", "surrogatepass")) % VOCAB


class FakeTokenizer:
    eos_token_ids = (0,)
    bos_token_id = None
    vocab_size = VOCAB

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Each word is a token: an integer word is its id mod VOCAB, any other word a
        stable id from its bytes (as a real tokenizer takes any text)."""
        return [_word_id(w) for w in text.split()]

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return "".join(f" {i}" for i in ids if not (skip_special_tokens and i == 0))

    def token_to_text(self, token_id: int) -> str:
        return f" {token_id}"

    def id_to_token(self, token_id: int) -> str:
        return str(token_id)

    def encode_chat(self, messages, add_generation_prompt: bool = True, tools=None,
                    continue_final_message: bool = False,
                    add_special_tokens: bool = False) -> list[int]:
        """[1] + the words of every message (content normalized as for a "string"
        template); a role named "bad" raises like a template. ``tools`` (what the
        template gets with tool_choice none) are not rendered; encode adds no special
        tokens, so ``add_special_tokens`` adds none either."""
        ids = [1]
        for m in messages:
            if m["role"] == "bad":
                raise ValueError("role 'bad' is not allowed")
        for m in normalize_messages(messages):
            ids += self.encode(m["content"])
        return ids


@dataclass
class _Step:
    new_text: str
    stopped: bool
    stop_str: str | None = None


class FakeDetokenizer:
    """Text " <id>" per token; a stop string ends generation and is not emitted."""

    def __init__(self, tokenizer, prompt_ids, stop, skip_special_tokens,
                 include_stop_str_in_output=False, min_tokens=0) -> None:
        self.tok, self.stop, self.text = tokenizer, tuple(stop), ""

    def push(self, token: int) -> _Step:
        piece = self.tok.decode([token])
        for s in self.stop:
            if s in self.text + piece:
                return _Step(piece[: (self.text + piece).index(s) - len(self.text)], True, s)
        self.text += piece
        return _Step(piece, False)

    def flush(self) -> str:
        return ""


@dataclass
class FakeKernelReport:
    data: dict = field(default_factory=lambda: {
        "layers": [
            {"layer": f"layers.{i}.{p}", "kernel_id": "torch_w8a16", "platform": "cpu",
             "scale_kind": "per_tensor", "n": 8, "k": 8,
             "rejections": [{"kernel_id": "avx512_w8a16", "reason": "no avx512"}],
             "warning": None,
             # q_proj's first choice is avx2: layers.1 fell back at startup, layers.0
             # started on avx2 and fell back at run time (below)
             "first_choice": "avx2_w8a16" if p == "q_proj" else "torch_w8a16"}
            for i in range(2) for p in ("q_proj", "o_proj")],
        "runtime_fallbacks": [{"layer": "layers.0.q_proj", "from_kernel": "avx2_w8a16",
                               "to_kernel": "torch_w8a16", "error": "boom"}]})

    def snapshot(self) -> dict:
        return self.data
