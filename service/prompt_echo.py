"""``max_tokens: 0`` with ``echo`` on /v1/completions (OpenAI's legacy completions, vLLM's
echo without generation): the answer is the prompt alone, with its logprobs when
``logprobs`` is set, as evaluation harnesses score a text. The engine generates one
token, whose prefill scores the prompt; that token is dropped here, from a whole answer's
choices and from each streamed output alike (the limit is CompletionRequest's
output_limit, service/schemas/completions.py)."""

from __future__ import annotations

from dataclasses import replace

from engine.request import FinishReason
from engine.stream import RequestOutput
from service.collect import Choice

_ENDED = (FinishReason.STOP, FinishReason.LENGTH)  # an error or abort stays what it was


def _finish(reason: FinishReason | None) -> FinishReason | None:
    """The limit of 0 tokens ended the choice (OpenAI's "length")."""
    return FinishReason.LENGTH if reason in _ENDED else reason


def prompt_only_choice(choice: Choice) -> Choice:
    """``choice`` without its generated token(s): text, ids and logprobs empty."""
    return replace(choice, text=[], token_ids=[], logprobs=[],
                   finish_reason=_finish(choice.finish_reason),
                   stop_reason=None if choice.finish_reason in _ENDED else choice.stop_reason)


def prompt_only_output(out: RequestOutput) -> RequestOutput:
    """A streamed output without its generated token(s) (the prompt's logprobs kept)."""
    ended = out.finish_reason in _ENDED
    return replace(out, text="", token_ids=(), logprobs=(), num_output_tokens=0,
                   finish_reason=_finish(out.finish_reason),
                   stop_reason=None if ended else out.stop_reason)
