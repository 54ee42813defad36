"""A chat request's run on the engine, shared by every API that speaks chat
(/v1/chat/completions, and /v1/messages and /v1/responses through service/translate/):
plan the tools and output format, compile the grammar, encode the prompt, submit, and
read each choice's output through a ChoiceReader. Each API only formats what comes out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from fastapi import Request
from starlette.concurrency import run_in_threadpool

from engine.request import InvalidRequestError
from engine.sampling_params import SamplingParams, SamplingParamsError, ThinkingBudget
from engine.stream import RequestOutput
from engine.text.chat_template import content_text
from service.backend import ServingState
from service.beam_search import BeamSubmission, beam_request, check_beam_fields
from service.collect import Choice, collect
from service.deps import check_model
from service.errors import APIError
from service.generation import Choices, submit
from service.images import encode_chat_prompt
from service.prompts import (
    OVERSIZE_TEXT_FACTOR,
    chat_text_chars,
    check_text_fits,
    truncate_prompt,
)
from service.schemas import ChatCompletionRequest, PredictionContent
from service.tool_calls.choice import ChoiceReader
from service.tool_calls.grammar import compile_plan_grammar
from service.tool_calls.plan import ChatPlan, plan_chat
from service.tool_calls.reasoning import parser_for_prompt
from service.tool_calls.thinking import chat_thinking


def make_params(state: ServingState, body: Any, logprobs: int | None,
                prompt_logprobs: int | None = None, grammar: Any = None,
                thinking: ThinkingBudget | None = None, fit_window: bool = False
                ) -> SamplingParams:
    """The request's sampling parameters; fields it leaves out take the model's
    generation_config.json defaults where the server applies them. It encodes the
    request's bad_words: routes call it through the thread pool. ``fit_window``: the
    output limit is a cap that max_model_len may lower (Anthropic's reading of
    max_tokens), not a demand the prompt must leave room for."""
    defaults = state.backend.sampling_defaults
    if body.allowed_token_ids is not None and grammar is not None:
        raise APIError(400, "allowed_token_ids: cannot be combined with a grammar "
                       "(structured outputs, response_format, tools): the two masks could "
                       "leave no token", "allowed_token_ids")
    try:
        limit, sent = body.output_limit(defaults.max_tokens), body.output_limit(None)
        if fit_window:
            sent = None
        params = SamplingParams(max_tokens=sent if limit == sent else None,
                                default_max_tokens=None if limit == sent else limit,
                                seed=None if body.seed == -1 else body.seed,  # vLLM's
                                logprobs=logprobs,
                                prompt_logprobs=prompt_logprobs, grammar=grammar,
                                thinking=thinking,
                                bad_words_ids=bad_words_ids(state, body.bad_words),
                                **body.sampling_kwargs(defaults))
        params.validate_for_vocab(state.backend.tokenizer.vocab_size)
    except SamplingParamsError as exc:
        raise APIError(400, str(exc), str(exc).split(":", 1)[0]) from exc
    return params


def bad_words_ids(state: ServingState, words: Sequence[str] | None
                  ) -> tuple[tuple[int, ...], ...]:
    """vLLM's bad_words as token sequences: each word as written and after a space (where
    that spells it with other tokens), without special tokens."""
    tok = state.backend.tokenizer
    out: dict[tuple[int, ...], None] = {}
    for word in words or ():
        for text in (word.lstrip(), " " + word.lstrip()):
            ids = tuple(tok.encode(text, add_special_tokens=False))
            if ids:
                out.setdefault(ids)
    return tuple(out)


@dataclass
class ChatRun:
    """A submitted chat request: its engine requests and one reader per choice."""

    model: str
    prompt: list[int]
    plan: ChatPlan
    params: SamplingParams
    sub: Choices
    readers: list[ChoiceReader]
    predicted: bool = False  # the request brought a prediction (its usage reports it)

    @property
    def reasoning(self) -> bool:
        return self.plan.reasoning_parser is not None

    def details(self, choices: Sequence[Choice | RequestOutput]) -> dict[str, int] | None:
        """OpenAI's usage.completion_tokens_details of the choices (whole, or each
        choice's latest output): reasoning tokens when a reasoning parser reads the
        output, accepted / rejected prediction tokens when the request brought a
        prediction; None when neither."""
        out = {}
        if self.reasoning:
            out["reasoning_tokens"] = sum(r.reasoning_tokens for r in self.readers)
        if self.predicted:
            out["accepted_prediction_tokens"] = sum(
                c.num_accepted_prediction_tokens for c in choices)
            out["rejected_prediction_tokens"] = sum(
                c.num_rejected_prediction_tokens for c in choices)
        return out or None

    async def collect(self, request: Request) -> list[Choice]:
        """Every choice, whole, each fed through its reader (non-streaming answers)."""
        choices = await collect(self.sub, request)
        for c, r in zip(choices, self.readers, strict=True):
            r.feed(RequestOutput(self.sub.id, "".join(c.text), tuple(c.token_ids),
                                 finished=True, stop_reason=c.stop_reason))
        return choices


def encode_prediction(state: ServingState, prediction: PredictionContent | None
                      ) -> tuple[int, ...]:
    """The predicted output's token ids (no special tokens); a 400 naming ``prediction``
    when it is longer than any answer can be."""
    if prediction is None or not prediction.text:
        return ()
    ids = state.backend.tokenizer.encode(prediction.text, add_special_tokens=False)
    limit = state.settings.max_model_len
    if len(ids) > limit:
        raise APIError(400, f"prediction: {len(ids)} tokens, longer than max_model_len "
                       f"({limit})", "prediction")
    return tuple(ids)


def truncate_chat(state: ServingState, prompt: list[int], images: Sequence[Any],
                  keep: int | None) -> list[int]:
    """The rendered prompt's last ``keep`` ids (vLLM's truncate_prompt_tokens); a 400 when
    that would cut a prompt with images (their places are counted from its start)."""
    kept = truncate_prompt(state, prompt, keep)
    if images and len(kept) < len(prompt):
        raise APIError(400, "truncate_prompt_tokens: a prompt with images is never cut "
                       f"({len(prompt)} tokens, {len(kept)} kept)", "truncate_prompt_tokens")
    return kept


async def chat_prompt(state: ServingState, body: ChatCompletionRequest
                      ) -> tuple[str, ChatPlan, list[int]]:
    """The served model name, the plan and the prompt ids (what count_tokens needs)."""
    model = check_model(state, body.model)
    plan = plan_chat(body, state.parsers)
    prompt, _ = await run_in_threadpool(encode_chat_prompt, state, body.messages,
                                        body.add_generation_prompt, plan)
    return model, plan, prompt


def prefill_text(messages: Sequence[Any], continue_final: bool) -> str | None:
    """The prefilled assistant message's text (its string content or text parts, joined)
    when the answer continues it (continue_final_message), else None."""
    if not continue_final or not messages:
        return None
    return content_text(messages[-1].content)


def grammar_field(plan: ChatPlan, grammar: Any) -> str | None:
    """The field that built a chat request's grammar (structured_outputs or a guided_*
    field, tools, response_format); None without one."""
    if grammar is None:
        return None
    if plan.structured is not None:
        return plan.structured[0]
    return "tools" if plan.tools and plan.tool_parser else "response_format"


def beam_refusal(plan: ChatPlan, grammar: Any, thinking: ThinkingBudget | None
                 ) -> str | None:
    """The field that asks a chat request for what beam search cannot do: a constrained
    output (tools, response_format, structured_outputs) or a cap on reasoning."""
    field = grammar_field(plan, grammar)
    if field is not None:
        return field
    return None if thinking is None else "reasoning_effort"


async def start_chat(state: ServingState, body: ChatCompletionRequest,
                     prefix: str = "chatcmpl", fit_window: bool = False) -> ChatRun:
    model = check_model(state, body.model)
    plan = plan_chat(body, state.parsers)
    thinking = chat_thinking(state.backend.tokenizer, plan, body)
    # the grammar first: a bad tool schema is named as such, not as a template failure
    grammar = await run_in_threadpool(compile_plan_grammar, state.backend, plan, thinking)
    check_text_fits(state, chat_text_chars(body.messages), "messages",
                    1 if body.truncate_prompt_tokens is None else OVERSIZE_TEXT_FACTOR)
    prompt, images = await run_in_threadpool(encode_chat_prompt, state, body.messages,
                                             body.add_generation_prompt, plan)
    prompt = truncate_chat(state, prompt, images, body.truncate_prompt_tokens)
    parser = await run_in_threadpool(parser_for_prompt, state.backend.tokenizer,
                                     plan.reasoning_parser, prompt,
                                     prefill_text(body.messages, plan.continue_final))
    if parser != plan.reasoning_parser:  # the prompt opened (or closed) a section
        plan = replace(plan, reasoning_parser=parser)
        thinking = chat_thinking(state.backend.tokenizer, plan, body)
        grammar = await run_in_threadpool(compile_plan_grammar, state.backend, plan, thinking)
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    params = await run_in_threadpool(make_params, state, body, logprobs, body.prompt_logprobs,
                                     grammar, thinking, fit_window)  # bad_words are encoded
    if (plan.tool_parser or plan.reasoning_parser) and not params.skip_special_tokens:
        # the parsers' message never shows special tokens, and stop strings cut it where
        # the engine's text has them (text_gate.py): that text skips them too
        params = replace(params, skip_special_tokens=True)
    prediction = await run_in_threadpool(encode_prediction, state, body.prediction)
    if body.use_beam_search:
        check_beam_fields(body, beam_refusal(plan, grammar, thinking))
    try:
        if body.use_beam_search:
            sub: Choices = BeamSubmission(
                state, prefix, [prompt], beam_request(state, body, params, logprobs),
                body.cache_salt, images, body.priority)
        else:
            sub = submit(state, prefix, [prompt], params, body.n, body.cache_salt, images,
                         prediction, body.priority, body.stream_interval)
    except InvalidRequestError as exc:  # the engine's "prompt" is the rendered messages
        if exc.param == "max_tokens" and body.max_completion_tokens is not None:
            raise APIError(400, str(exc).replace("max_tokens", "max_completion_tokens"),
                           "max_completion_tokens", counted=True) from exc
        if exc.param != "prompt":
            raise
        raise APIError(400, f"messages: {exc}", "messages", counted=True) from exc
    sub.grammar_param = grammar_field(plan, grammar)
    tok = state.backend.tokenizer
    readers = [ChoiceReader(tok, plan, bool(params.stop)) for _ in sub.ids]
    return ChatRun(model, prompt, plan, params, sub, readers, body.prediction is not None)
