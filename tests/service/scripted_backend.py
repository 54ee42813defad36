"""A backend whose "model" writes a scripted output, for API tests of what the server makes
of exact token streams (tool calls, reasoning, stop strings).

ScriptTokenizer: specials (</s>, <s>, [TOOL_CALLS], [ARGS], [THINK], [/THINK] and script
markers <script0>..<script15>), a few whole words, then every printable ASCII character
and "\n";
encoding is greedy longest match. A chat prompt is <s> + every message's content; a content
of "<scriptK>" makes the model write script K (a string, encoded) token by token, then
</s>.
"""

from __future__ import annotations

import string
from collections.abc import Sequence

from engine.checkpoint.generation import SamplingDefaults
from engine.config import EngineConfig
from engine.hardware import HardwareInfo
from engine.text.chat_template import normalize_messages
from service.backend import ModelBackend
from service.settings import Settings
from tests.engine.fake_runner import CacheCheckingRunner, FakeKernelReport

MODEL = "scripted-model"
SPECIALS = ["</s>", "<s>", "[TOOL_CALLS]", "[ARGS]", "[THINK]", "[/THINK]",
            *(f"<script{k}>" for k in range(16))]
WORDS = ["<tool_call>", "</tool_call>", "get_weather", "get_time", "Paris", "Rome",
         '{"city": "', '"}', "Hello", " world", "<think>", "</think>"]
# then "\n", last, so that the other ids stay (the string-template join of content
# parts, "\n\n", encodes)
VOCAB = SPECIALS + WORDS + list(string.printable[:95]) + ["\n"]


class ScriptTokenizer:
    eos_token_ids = frozenset({0})
    bos_token_id = 1

    def __init__(self, chat_template: str = "") -> None:
        self.chat_template = chat_template
        self._ids = {t: i for i, t in enumerate(VOCAB)}
        self._by_len = sorted(self._ids, key=len, reverse=True)

    @property
    def vocab_size(self) -> int:
        return len(VOCAB)

    def token_to_id(self, token: str) -> int | None:
        return self._ids.get(token)

    def is_special(self, token_id: int) -> bool:
        return token_id < len(SPECIALS)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        ids, i = [], 0
        while i < len(text):
            tok = next(t for t in self._by_len if text.startswith(t, i))
            ids.append(self._ids[tok])
            i += len(tok)
        return ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(VOCAB[i] for i in ids
                       if not (skip_special_tokens and i < len(SPECIALS)))

    def token_to_text(self, token_id: int) -> str:
        return VOCAB[token_id]

    def id_to_token(self, token_id: int) -> str:
        return VOCAB[token_id]

    def encode_chat(self, messages, add_generation_prompt: bool = True,
                    add_special_tokens: bool = False, **_) -> list[int]:
        ids = [1, 1] if add_special_tokens else [1]
        for m in normalize_messages(messages):  # content as for a "string" template
            ids += self.encode(m["content"])
        return ids


def script_model(tok: ScriptTokenizer, scripts: Sequence[str]):
    """sequence -> next token: the script named by the last marker, then </s>. A script's
    reasoning that the sampler closed early (a thinking budget) goes on with what the script
    writes after its own end marker, as a model answers once its reasoning is closed."""
    marker = {tok.token_to_id(f"<script{k}>"): k for k in range(len(scripts))}
    ids = [tok.encode(s) for s in scripts]
    ends = {tok.token_to_id("[/THINK]"), tok.token_to_id("</think>")}

    def next_token(seq: list[int]) -> int:
        at = max(i for i, t in enumerate(seq) if t in marker)
        script, out = ids[marker[seq[at]]], seq[at + 1:]
        k = len(out)
        closed = next((j for j, t in enumerate(out) if t in ends), None)
        if closed is not None and out[closed] in script:
            k = script.index(out[closed]) + k - closed
        return script[k] if k < len(script) else 0
    return next_token


class _NoGrammar:
    """The scripted model writes its script whatever the mask: these tests read outputs, so
    requests run unconstrained (grammars are tested in tests/engine/structured and
    end to end in tests/service/test_e2e_tools.py)."""

    def compile(self, spec):
        return None


class ScriptedBackend(ModelBackend):
    @property
    def grammar_compiler(self):
        return _NoGrammar()


def scripted_loader(scripts: Sequence[str], chat_template: str = ""):
    def load(settings: Settings) -> ModelBackend:
        tok = ScriptTokenizer(chat_template)
        runner = CacheCheckingRunner(num_kv_blocks=256, block_size=4,
                                     next_fn=script_model(tok, scripts), vocab=len(VOCAB))
        runner.kernel_report = FakeKernelReport()
        cfg = EngineConfig(model_dir=".", max_num_seqs=settings.max_num_seqs,
                           max_model_len=settings.max_model_len,
                           max_num_batched_tokens=settings.max_num_batched_tokens)
        return ScriptedBackend(runner, tok, MODEL, HardwareInfo.fake("avx2", "fma"), cfg,
                            sampling_defaults=SamplingDefaults())
    return load
