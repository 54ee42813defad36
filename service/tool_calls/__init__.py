"""Tool-call and reasoning parsers on token ids, whole outputs and streaming deltas.

Entry points: ``OutputParser`` (streaming: feed(ids) -> DeltaMessage, finish()) and
``parse_output`` (non-streaming -> ParsedMessage); tool parsers "mistral" (special tokens,
v3-v13 wire forms) and "hermes" (``<tool_call>`` text blocks); reasoning parsers
"mistral" (``[THINK]``), "think" (``<think>`` text) and "think-open" (the prompt opened
``<think>``). ``CallIdMap`` / ``new_call_id``: 9-character call ids as Mistral's
tokenizers validate them.
"""

from service.tool_calls.call_ids import CallIdMap, is_call_id, new_call_id
from service.tool_calls.deltas import DeltaMessage, ParsedMessage, ToolCall, ToolCallDelta
from service.tool_calls.output import (
    REASONING_PARSERS,
    TOOL_PARSERS,
    OutputParser,
    parse_output,
)
from service.tool_calls.vocab import MissingTokenError, TokenVocab

__all__ = ["REASONING_PARSERS", "TOOL_PARSERS", "CallIdMap", "DeltaMessage",
           "MissingTokenError", "OutputParser", "ParsedMessage", "TokenVocab", "ToolCall",
           "ToolCallDelta", "is_call_id", "new_call_id", "parse_output"]
