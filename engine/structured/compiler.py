"""GrammarSpec -> CompiledGrammar, cached by spec (thread-safe LRU).

Compiling (llguidance builds the lexer and checks the grammar against the vocabulary)
takes ~1-100 ms and releases the GIL: call :meth:`GrammarCompiler.compile` from a thread
pool (``run_in_threadpool``), never on the engine thread. A :class:`CompiledGrammar` keeps
one pristine matcher; each request gets a deep copy of it (microseconds), so compiled
grammars are shared between requests and never mutated.
"""

from __future__ import annotations

import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

from engine.structured.ll_tokenizer import ll_tokenizer
from engine.structured.matcher import GrammarMatcher
from engine.structured.spec import GrammarError, GrammarSpec

DEFAULT_CACHE_SIZE = 256
# llguidance recurses once per link of a $ref or rule chain while it builds a grammar: a
# chain of ~2000 overflowed a worker thread's 8 MiB stack and the process died (SIGSEGV,
# every request with it). Builds run on a thread of this stack (address space, touched
# only as deep as a build goes), where such chains end in llguidance's own size limits.
BUILD_STACK_BYTES = 1 << 30
_stack_lock = threading.Lock()


def on_big_stack(fn: Any, *args: Any) -> Any:
    """``fn(*args)`` on a new thread of BUILD_STACK_BYTES of stack; its result or its
    exception, in this thread."""
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            box["error"] = exc

    with _stack_lock:  # stack_size is process-wide: set it for this one thread only
        old = threading.stack_size(BUILD_STACK_BYTES)
        try:
            worker = threading.Thread(target=run, name="fp8serve-grammar-build", daemon=True)
            worker.start()
        finally:
            threading.stack_size(old)
    worker.join()
    if "error" in box:
        raise box["error"]
    return box["value"]


@dataclass(frozen=True, eq=False)
class CompiledGrammar:
    """A compiled spec for one tokenizer. vocab_size: the tokenizer's ids (mask columns at
    or above it are never allowed)."""

    spec: GrammarSpec
    vocab_size: int
    pristine: Any  # llguidance.LLMatcher in its start state; read only

    def new_matcher(self) -> GrammarMatcher:
        """A fresh per-request matcher at the start of the grammar."""
        return GrammarMatcher(self.pristine.deep_copy(), self.vocab_size, self.spec.kind)


class GrammarCompiler:
    """Compiles specs for one tokenizer (``engine.text.tokenizer.Tokenizer``)."""

    def __init__(self, tokenizer: Any, cache_size: int = DEFAULT_CACHE_SIZE) -> None:
        if cache_size < 1:
            raise ValueError(f"cache_size must be >= 1, got {cache_size}")
        self.tokenizer = tokenizer
        self.cache_size = cache_size
        self._cache: OrderedDict[GrammarSpec, CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()

    def compile(self, spec: GrammarSpec) -> CompiledGrammar:
        """The compiled grammar (the cached object when ``spec`` was seen); raises
        GrammarError when llguidance rejects the grammar or schema."""
        with self._lock:
            hit = self._cache.get(spec)
            if hit is not None:
                self._cache.move_to_end(spec)
                return hit
        built = on_big_stack(self._build, spec)  # outside the lock: compiles run in parallel
        with self._lock:
            kept = self._cache.setdefault(spec, built)
            self._cache.move_to_end(spec)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
            return kept

    def _build(self, spec: GrammarSpec) -> CompiledGrammar:
        import llguidance as llg

        tok = ll_tokenizer(self.tokenizer)
        try:
            grammar = llg.LLMatcher.grammar_from_lark(spec.lark)
            matcher = llg.LLMatcher(tok, grammar, log_level=0)
        except (ValueError, TypeError) as exc:
            raise GrammarError(f"{spec.name}: {exc}") from exc
        if matcher.is_error():
            raise GrammarError(f"{spec.name}: {_first_line(matcher.get_error())}")
        probe = matcher.deep_copy()  # the first mask, on a copy: an empty language fails here
        probe.compute_bitmask()
        if probe.is_error():
            raise GrammarError(f"{spec.name}: no output satisfies it, not even a first token "
                               f"({_first_line(probe.get_error())})")
        return CompiledGrammar(spec, tok.vocab_size, matcher)

    def __len__(self) -> int:
        with self._lock:
            return len(self._cache)


def _first_line(message: str) -> str:
    """llguidance errors carry the grammar source after the first line; keep the reason."""
    return message.strip().splitlines()[0] if message.strip() else "invalid grammar"


_compilers: weakref.WeakKeyDictionary[Any, GrammarCompiler] = weakref.WeakKeyDictionary()
_compilers_lock = threading.Lock()


def compiler_for(tokenizer: Any) -> GrammarCompiler:
    """The shared compiler (and cache) of ``tokenizer``."""
    with _compilers_lock:
        got = _compilers.get(tokenizer)
        if got is None:
            got = _compilers[tokenizer] = GrammarCompiler(tokenizer)
        return got
