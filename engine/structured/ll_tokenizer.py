"""Our ``engine.text.tokenizer.Tokenizer`` as an ``llguidance.LLTokenizer`` (built once per
tokenizer object and cached; building reads the whole vocabulary, ~0.3 s for 49k ids).

* ``tokenizer.json`` (HfBackend): the JSON text goes to llguidance, which loads it with the
  same Rust ``tokenizers`` library;
* ``tekken.json`` (TekkenBackend): mistral-common's ``MistralLLGTokenizer`` lists every
  id's bytes, special tokens renamed ``[X]`` -> ``<X>`` (grammars name them ``<[id]>``).

EOS ids come from ``Tokenizer.eos_token_ids``; the vocabulary size is
``Tokenizer.vocab_size`` (the model's logits may have more columns: padding, masked by
the sampler for constrained rows).
"""

from __future__ import annotations

import threading
import weakref
from typing import Any

from engine.structured.spec import GrammarError

_cache: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def _build(tokenizer: Any) -> Any:
    import llguidance as llg

    backend = getattr(tokenizer, "backend", None)
    eos = sorted(tokenizer.eos_token_ids)
    if not eos:
        raise GrammarError("constrained decoding needs the tokenizer's EOS id")
    n = tokenizer.vocab_size
    if hasattr(backend, "to_json_str"):
        return llg.LLTokenizer(backend.to_json_str(), n_vocab=n, eos_token=eos)
    if hasattr(backend, "tekkenizer"):
        from mistral_common.guidance.tokenizer import MistralLLGTokenizer

        wrapped = llg.TokenizerWrapper(MistralLLGTokenizer(backend.tekkenizer))
        return llg.LLTokenizer(wrapped, n_vocab=n, eos_token=eos)
    kind = type(backend if backend is not None else tokenizer).__name__
    raise GrammarError(f"constrained decoding does not support this tokenizer ({kind})")


def ll_tokenizer(tokenizer: Any) -> Any:
    """The cached ``llguidance.LLTokenizer`` for ``tokenizer`` (thread-safe)."""
    with _lock:
        got = _cache.get(tokenizer)
        if got is None:
            got = _cache[tokenizer] = _build(tokenizer)
        return got
