"""engine/structured/compiler.py and ll_tokenizer.py: caching, errors, thread safety; and
SamplingParams.grammar."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from engine.demo_model import ensure_demo_model
from engine.sampling_params import SamplingParams, SamplingParamsError
from engine.structured import (
    GrammarCompiler,
    GrammarError,
    GrammarSpec,
    compiler_for,
    json_schema_spec,
)
from engine.structured.ll_tokenizer import ll_tokenizer
from tests.engine.structured.conftest import PARSE_SCHEMA


def test_cache_returns_the_same_object(demo_tokenizer):
    c = compiler_for(demo_tokenizer)
    assert compiler_for(demo_tokenizer) is c
    a = c.compile(json_schema_spec(PARSE_SCHEMA, "Person"))
    b = c.compile(json_schema_spec(dict(PARSE_SCHEMA), "other name, same grammar"))
    assert a is b and a.vocab_size == demo_tokenizer.vocab_size
    assert a.new_matcher() is not a.new_matcher()


def test_lru_evicts_the_least_recent(tekken_tokenizer):
    c = GrammarCompiler(tekken_tokenizer, cache_size=2)
    s1, s2, s3 = (json_schema_spec({"type": "array", "maxItems": n}) for n in (1, 2, 3))
    g1 = c.compile(s1)
    c.compile(s2)
    assert c.compile(s1) is g1  # s1 is now the most recent
    c.compile(s3)  # evicts s2
    assert len(c) == 2 and c.compile(s1) is g1
    with pytest.raises(ValueError):
        GrammarCompiler(tekken_tokenizer, cache_size=0)


def test_llguidance_tokenizer_built_once(any_tokenizer):
    assert ll_tokenizer(any_tokenizer) is ll_tokenizer(any_tokenizer)
    assert ll_tokenizer(any_tokenizer).vocab_size == any_tokenizer.vocab_size


@pytest.mark.parametrize("spec", [
    json_schema_spec({"type": "foo"}),
    json_schema_spec({"type": "object", "properties": {"a": {"$ref": "#/$defs/missing"}}}),
    GrammarSpec("start: undefined_rule\n"),
    GrammarSpec("start: %json {not json}\n"),
])
def test_invalid_grammar_raises(demo_tokenizer, spec):
    with pytest.raises(GrammarError):
        GrammarCompiler(demo_tokenizer).compile(spec)


def test_a_grammar_with_no_first_token_is_an_error(any_tokenizer):
    """A schema that is only a reference to itself admits no output: an error at compile
    time (a 400), not a request that ends at once with EOS and an empty answer."""
    with pytest.raises(GrammarError, match="no output satisfies it"):
        GrammarCompiler(any_tokenizer).compile(json_schema_spec({"$ref": "#"}))
    # a grammar whose language is the empty string still compiles
    assert GrammarCompiler(any_tokenizer).compile(GrammarSpec('start: ""\n')) is not None


def test_compiles_from_a_thread_pool(tekken_tokenizer):
    c = GrammarCompiler(tekken_tokenizer)
    specs = [json_schema_spec({"type": "array", "maxItems": n % 3}) for n in range(12)]
    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(c.compile, specs))
    assert len({id(g) for g in got}) == 3 and len(c) == 3


def test_the_empty_schema_compiles(tekken_tokenizer):
    """A json_schema response format without a schema (any JSON value) compiles."""
    g = compiler_for(tekken_tokenizer).compile(json_schema_spec({}))
    assert g is not None


def test_sampling_params_grammar(tekken_tokenizer):
    g = compiler_for(tekken_tokenizer).compile(json_schema_spec({"type": "object"}))
    p = SamplingParams(grammar=g)
    assert p == SamplingParams() and p.grammar is g  # not part of equality
    p.validate_for_vocab(tekken_tokenizer.vocab_size + 8)  # model padding is fine
    with pytest.raises(SamplingParamsError, match="grammar"):
        p.validate_for_vocab(tekken_tokenizer.vocab_size - 1)
    with pytest.raises(SamplingParamsError, match="grammar"):
        SamplingParams(grammar="start: x")


CHAINS = '''
import sys
from concurrent.futures import ThreadPoolExecutor
from engine.structured import GrammarError, GrammarSpec, compiler_for, json_schema_spec
from engine.text.tokenizer import Tokenizer
comp = compiler_for(Tokenizer.from_dir(sys.argv[1]))
n = 3000
defs = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(n)}
defs[f"d{n}"] = {"type": "integer"}
rules = "start: r0\\n" + "".join(f"r{i}: r{i + 1}\\n" for i in range(n)) + f'r{n}: "x"\\n'
specs = [json_schema_spec({"$defs": defs, "$ref": "#/$defs/d0"}, "chain", strict=False),
         GrammarSpec(rules, "rule chain")]
with ThreadPoolExecutor(2) as pool:  # a server's worker threads: 8 MiB stacks
    for spec in specs:
        try:
            pool.submit(comp.compile, spec).result()
            print("compiled")
        except GrammarError as exc:
            print("refused", exc)
'''


def test_a_deep_reference_chain_never_overflows_the_stack(tmp_path):
    """llguidance recurses once per link of a $ref or rule chain: 3000 links on a worker
    thread's 8 MiB stack killed the process (SIGSEGV, the whole server with it; a 106 KB
    request). Builds run on a thread with a large stack: a chain compiles, or is refused
    by llguidance's own limits (a 400)."""
    import subprocess
    import sys

    script = tmp_path / "chains.py"
    script.write_text(CHAINS)
    run = subprocess.run([sys.executable, str(script), str(ensure_demo_model())],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert run.stdout.count("compiled") + run.stdout.count("refused") == 2, run.stdout
