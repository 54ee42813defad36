"""Grammar-constrained decoding on CPU (llguidance token masks).

Entry points for the HTTP layer (all raise :class:`GrammarError` -> HTTP 400)::

    from engine.structured import (GrammarError, compiler_for, spec_from_response_format,
                                   tool_call_grammar)

    # 1. a spec (pure data) from the request
    spec = spec_from_response_format(body.response_format)      # GrammarSpec | None
    spec = spec_from_structured_outputs(params)  # vLLM's structured_outputs (a dict)
    spec = tool_call_grammar(tools, tool_choice, parallel_tool_calls,   # GrammarSpec | None
                             style="mistral" | "hermes", vocab=tokenizer,
                             response_format=body.response_format)
    #    (tool_call_grammar already folds response_format in; "none" -> the format alone)

    # 2. compile it, off the event loop and off the engine thread (cached by spec, LRU)
    compiled = await run_in_threadpool(compiler_for(tokenizer).compile, spec)
    #    or backend.grammar_compiler.compile(spec) (service/backend.py)

    # 3. submit as usual
    params = SamplingParams(..., grammar=compiled)

Signatures:

* ``spec_from_response_format(response_format: Mapping | None) -> GrammarSpec | None``
* ``spec_from_structured_outputs(params: Mapping | None) -> GrammarSpec | None``
  (engine/structured/outputs.py: json, regex, choice, grammar (Lark or GBNF),
  json_object, and the JSON options)
* ``json_object_spec() -> GrammarSpec``;
  ``json_schema_spec(schema: Mapping, name="schema", strict=True) -> GrammarSpec``
* ``tool_call_grammar(tools, tool_choice="auto", parallel_tool_calls=True,
  style="mistral", vocab=None, response_format=None) -> GrammarSpec | None``
* ``compiler_for(tokenizer) -> GrammarCompiler``;
  ``GrammarCompiler.compile(spec: GrammarSpec) -> CompiledGrammar``

The engine (engine/postprocess.py) gives each constrained request a matcher
(``CompiledGrammar.new_matcher()``), masks its logits rows before penalties and bias
(engine/sampler.py, :class:`TokenMask`), advances the matcher with each sampled token and
ends the request with ``stop`` when the grammar is complete. The mistral style emits
``[TOOL_CALLS]``/``[ARGS]`` as special tokens: a caller that parses them from the text
needs ``skip_special_tokens=False``.
"""

from engine.structured.compiler import CompiledGrammar, GrammarCompiler, compiler_for
from engine.structured.matcher import GrammarMatcher, GrammarMatchError, fill_token_mask
from engine.structured.outputs import spec_from_structured_outputs
from engine.structured.spec import (
    GrammarError,
    GrammarSpec,
    json_object_spec,
    json_schema_spec,
    spec_from_response_format,
)
from engine.structured.token_mask import TokenMask, apply_token_mask
from engine.structured.tool_grammar import tool_call_grammar

__all__ = ["CompiledGrammar", "GrammarCompiler", "GrammarError", "GrammarMatchError",
           "GrammarMatcher", "GrammarSpec", "TokenMask", "apply_token_mask", "compiler_for",
           "fill_token_mask", "json_object_spec", "json_schema_spec",
           "spec_from_response_format", "spec_from_structured_outputs", "tool_call_grammar"]
