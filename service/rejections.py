"""The 400s a schema-valid request can still get: rules the JSON schema of /openapi.json
cannot state (the model's vocabulary and context, its tool-call and reasoning formats,
rules across several fields or messages, a signature). Each operation lists its rules in
its 400 response (service/openapi.py): the description names them, and
``x-fp8serve-rules`` carries them as data, so a client or a fuzzer can tell a documented
refusal from a contract violation.

A rule is (param, words, why): the error names ``param`` or a field under it (OpenAI's
``error.param``; Anthropic's message starts with it) and its message holds ``words``.
What the schema can state (required fields, lengths, bounds, enums) it states instead."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from service.translate.refusals import messages_field, responses_field


@dataclass(frozen=True, slots=True)
class Rule:
    param: str  # the field the error names (a prefix: "messages" covers messages[2].content)
    words: str  # words its message holds
    why: str  # the rule, for the description

    def as_dict(self) -> dict[str, str]:
        return {"param": self.param, "message": self.words, "rule": self.why}

    def matches(self, param: str, message: str) -> bool:
        return param.startswith(self.param) and self.words in message


def _vocab(param: str) -> Rule:
    return Rule(param, "out of range", "token ids must be below the model's vocabulary size")


# a RecursionError while a body is read or walked (service/errors.py)
NESTING = Rule("", "nests deeper", "the body's arrays and objects nest within a few "
               "hundred levels")
CONTEXT = (
    Rule("max_tokens", "max_model_len", "the prompt plus the output limit must fit max_model_len"),
    Rule("max_tokens", "KV", "the prompt plus the output limit must fit the KV cache"),
    Rule("messages", "max_model_len", "the rendered prompt must leave room to generate"),
    Rule("messages", "KV cache", "the rendered prompt must leave room to generate in the "
         "KV cache"),
)
SAMPLING = (
    Rule("prompt_logprobs", "stream is true", "prompt_logprobs come with a whole answer, "
         "not a stream"),
    Rule("min_tokens", "exceeds max_tokens", "min_tokens must not exceed max_tokens"),
    Rule("stream_options", "when stream is true", "stream_options needs stream true"),
    Rule("length_penalty", "needs use_beam_search", "length_penalty ranks beams: a value "
         "other than 1 needs use_beam_search true"),
    Rule("stream_options.continuous_usage_stats", "needs include_usage",
         "continuous_usage_stats needs include_usage true"),
    _vocab("logit_bias"), _vocab("stop_token_ids"), _vocab("allowed_token_ids"),
    Rule("allowed_token_ids", "combined with a grammar", "allowed_token_ids goes without "
         "a grammar (structured outputs, response_format, tools)"),
    Rule("priority", "needs priority scheduling", "a priority other than 0 needs a server "
         "started with --scheduling-policy priority"),
)
IMAGES = (
    Rule("messages", "does not take images", "image parts need a model with a vision tower"),
    Rule("messages", "image", "an image part's URL must pass the server's media policy "
         "(--allowed-media-domains, --allowed-local-media-path, size limits) and decode; "
         "at most --limit-mm-per-prompt images; image parts in user messages only"),
)
TEMPLATE = (
    Rule("chat_template_kwargs", "template variable itself", "chat_template_kwargs may not "
         "set the variables the server gives the template (messages, tools, "
         "add_generation_prompt, documents, special tokens)"),
    Rule("chat_template_kwargs", "no chat template", "chat_template_kwargs needs a model "
         "whose chat encoding is a Jinja template"),
    Rule("chat_template", "takes no request chat templates", "a request's chat_template "
         "needs a server started with --trust-request-chat-template"),
    Rule("chat_template", "syntax error", "a request's chat_template must compile"),
    Rule("documents", "reads no documents", "documents need a chat template that renders "
         "them (its documents variable)"),
)
CONTINUE = (
    Rule("continue_final_message", "add_generation_prompt", "continue_final_message needs "
         "add_generation_prompt false"),
    Rule("continue_final_message", "final message must be", "continue_final_message needs "
         "a final assistant message with text and no tool calls"),
    Rule("messages", "continue", "the final message to continue has text the chat template "
         "renders as it was sent"),
)
TOOL_TURNS = (Rule("messages", "answers no tool call",
                   "a tool message's tool_call_id names a call of an earlier assistant message"),)
MESSAGES = (
    Rule("messages", "content part", "content parts are text or image parts"),
    Rule("messages", "chat template", "the model's chat template must render the messages "
         "(some templates refuse roles out of turn)"),
    Rule("messages", "is not valid JSON", "a tool call's arguments are JSON text"),
    Rule("messages", "prompt is empty", "the rendered prompt must hold a token"),
    Rule("messages", "two names for one text", "an assistant message's reasoning and "
         "reasoning_content, when both are sent, are equal"),
    Rule("messages", "one of content and refusal", "an assistant message with a refusal "
         "has no content"),
    *IMAGES,
)
TOOLS = (
    Rule("tool_choice", "needs tools", "a tool_choice other than none needs tools"),
    Rule("tool_choice", "not among the tools", "a named tool_choice names one of the tools"),
    Rule("tools", "given twice", "tool names are unique"),
    Rule("tools", "no tool-call format", "tools need a model with a tool-call parser "
         "(--tool-call-parser)"),
    Rule("tools", "as a grammar", "a tool's parameters schema must compile to a grammar"),
    Rule("response_format", "cannot be combined",
         "json_object / json_schema cannot go with a required or named tool_choice"),
    Rule("response_format", "as a grammar", "the format's schema must compile to a grammar "
         "over the model's vocabulary"),
)

def _constraint(param: str) -> tuple[Rule, ...]:
    """vLLM's structured_outputs (and its older guided_* / structural_tag fields)."""
    return (
        Rule(param, "invalid constraint", "exactly one of json, regex, choice, grammar, "
             "json_object, structural_tag, each well formed (a JSON schema, a regex, a "
             "non-empty list of strings, a Lark or GBNF grammar, triggers and structures "
             "whose begin starts with a trigger; not xgrammar's format form)"),
        Rule(param, "cannot be combined", "the constraint goes alone: not with "
             "response_format, tools the model may call, or its other form"),
        Rule(param, "as a grammar", "the constraint must compile to a grammar for the "
             "model's tokenizer (llguidance)"),
    )


STRUCTURED = (*_constraint("structured_outputs"), *_constraint("guided_"),
              *_constraint("structural_tag"),
              Rule("guided_decoding_backend", "is not available",
                   "the one backend is llguidance (auto, guidance or llguidance)"))
REASONING = (
    Rule("thinking_token_budget", "no reasoning format",
         "a reasoning budget needs a model with a reasoning parser (--reasoning-parser)"),
    Rule("thinking_token_budget", "not single tokens",
         "a reasoning budget needs reasoning markers that are single tokens"),
    Rule("reasoning_effort", "is not supported", "of the efforts only none is served"),
)

# vLLM's use_beam_search (service/beam_search.py): what it cannot honour
_BEAM_REFUSED = ("temperature", "top_p", "top_k", "min_p", "presence_penalty",
                 "frequency_penalty", "repetition_penalty", "logit_bias", "allowed_token_ids",
                 "bad_words", "min_tokens", "stop", "prompt_logprobs", "n", "best_of")
BEAM = tuple(Rule(p, "use_beam_search", "use_beam_search ranks beams by the model's own "
                  "logprobs: no sampling fields (temperature 0 or 1), stop strings, prompt "
                  "logprobs or constraints; n (the width) at most 10; best_of equal to n")
             for p in _BEAM_REFUSED)
BEAM_CONSTRAINTS = tuple(Rule(p, "use_beam_search", "use_beam_search goes without a "
                              "constrained output")
                         for p in ("response_format", "structured_outputs", "guided_"))
# ranking by summed logprobs on a server that reports logits (--logprobs-mode *_logits)
RANKED = tuple(Rule(p, "--logprobs-mode", f"{p} ranks by log-probabilities: not on a "
                    "server whose --logprobs-mode reports logits")
               for p in ("use_beam_search", "best_of"))
# more choices than the engine runs and queues (service/generation.py check_choices)
CHOICES = tuple(Rule(p, "choices (prompts x", "the choices (n x prompts, or best_of) fit "
                     "--max-num-seqs + --max-queue") for p in ("n", "best_of"))
TRUNCATE = (Rule("truncate_prompt_tokens", "keep at least 1",
                 "truncate_prompt_tokens keeps 1 or more tokens, or -1 (max_model_len)"),
            Rule("truncate_prompt_tokens", "greater than max_model_len",
                 "truncate_prompt_tokens keeps at most --max-model-len tokens (vLLM's rule)"))
COMPLETIONS = (*CONTEXT, *SAMPLING, _vocab("prompt"), *STRUCTURED,
               Rule("response_format", "as a grammar", "the format's schema must compile "
                    "to a grammar for the model's tokenizer (llguidance)"),
               Rule("response_format", "invalid constraint", "a structural_tag needs "
                    "non-empty triggers and structures, each begin starting with a trigger"),
               Rule("prompt", "max_model_len", "the prompt must leave room to generate"),
               Rule("prompt", "KV cache", "the prompt must leave room to generate in the KV "
                    "cache"),
               Rule("best_of", "less than n", "best_of is at least n"),
               Rule("max_tokens", "needs echo", "max_tokens 0 (the prompt alone) needs echo "
                    "true"),
               Rule("best_of", "not with stream", "best_of above n needs stream false"),
               *TRUNCATE, *BEAM, *BEAM_CONSTRAINTS, *CHOICES, *RANKED,
               Rule("echo", "use_beam_search", "echo with logprobs (the prompt's logprobs) "
                    "goes without use_beam_search"),
               Rule("prompt", "prompt is empty", "a text that encodes to no tokens needs a "
                    "tokenizer with a BOS or EOS token to start the document"), NESTING)
PREDICTION = (Rule("prediction", "longer than max_model_len",
                   "a prediction must not exceed max_model_len tokens"),)
CHAT = (*CONTEXT, *(Rule("max_completion_tokens", r.words, r.why) for r in CONTEXT[:2]),
        *SAMPLING, *TOOL_TURNS, *MESSAGES, *TOOLS, *REASONING, *PREDICTION,
        *STRUCTURED, *TEMPLATE, *CONTINUE, *TRUNCATE, *BEAM, *BEAM_CONSTRAINTS, CHOICES[0],
        RANKED[0],
        *(Rule(p, "use_beam_search", "use_beam_search goes without tools, a prediction or "
               "a cap on reasoning")
          for p in ("tools", "prediction", "thinking_token_budget", "reasoning_effort")),
        Rule("top_logprobs", "needs logprobs true", "top_logprobs above 0 needs logprobs "
             "true"),
        Rule("store", "stores no chat completions", "store true needs a server that keeps "
             "them (--responses-store-mib above 0)"),
        Rule("metadata", "is kept only with the answer", "metadata needs store true"),
        Rule("truncate_prompt_tokens", "with images is never cut",
             "truncate_prompt_tokens must keep the whole of a prompt with images"), NESTING)
INVOCATIONS = tuple(dict.fromkeys((*CHAT, *COMPLETIONS)))  # either, by the body
# /tokenize's options that render messages: beside a text prompt they would change nothing
TOKENIZE_CHAT_OPTIONS = ("tools", "add_generation_prompt", "continue_final_message",
                         "chat_template_kwargs", "chat_template")
TOKENIZE = (*TOOL_TURNS, *MESSAGES, *TEMPLATE, *CONTINUE, NESTING,
            *(Rule(p, "renders messages", "the chat options go with messages, not with a "
                   "text prompt") for p in TOKENIZE_CHAT_OPTIONS),
            *(r for r in TOOLS if r.param == "tools" and r.words != "as a grammar"))
DETOKENIZE = (_vocab("tokens"),)
def _renamed(rules: tuple[Rule, ...], field: Callable[[str], str]) -> tuple[Rule, ...]:
    """Chat's rules on a translated API: the fields named as its refusals name them
    (service/translate/refusals.py)."""
    return tuple(Rule(field(r.param), r.words, r.why) for r in rules)


_ANTHROPIC = (
    Rule("messages", "invalid signature in thinking block", "a thinking block's signature "
         "must verify (a block this server signed, unchanged; unsigned blocks are accepted)"),
    Rule("messages", "answers no tool_use",
         "a tool_result block answers a tool_use block of an earlier assistant message"),
    Rule("messages", "tool_result block after", "a user message's tool_result blocks come "
         "before its text and image blocks"),
    Rule("messages", "cannot carry", "user messages carry text, image and tool_result "
         "blocks; assistant messages text, tool_use and thinking blocks"),
    Rule("messages", "no message to answer", "messages must hold a message with content "
         "(thinking blocks and empty text are dropped)"),
    Rule("messages", "image in a tool_result", "a tool_result holds a string or text "
         "blocks (tool results are read as text)"),
    Rule("thinking", "no reasoning format",
         "thinking needs a model with a reasoning parser (--reasoning-parser)"),
    Rule("thinking", "not single tokens",
         "a thinking budget needs reasoning markers that are single tokens"),
    Rule("messages", "must start with a thinking block", "with thinking enabled, a final "
         "assistant message (a prefill) starts with a thinking or redacted_thinking block"),
    Rule("thinking", "forces tool use", "thinking enabled goes with a tool_choice of auto "
         "or none (not any or tool), as Anthropic's rule"),
    Rule("output_config.effort", "is not supported",
         "there is no effort control: only null is accepted"),
    *_renamed(tuple(r for r in (*MESSAGES, *TOOLS) if r.words != "content part"),
              messages_field), NESTING,
)
MESSAGES_API = (
    # max_tokens past max_model_len or the KV cache stops there (stop_reason
    # model_context_window_exceeded): only the prompt's own rules remain
    *_ANTHROPIC, *_renamed(CONTEXT[2:], messages_field),
    Rule("thinking.budget_tokens", "less than max_tokens",
         "thinking.budget_tokens must be less than max_tokens"),
    Rule("thread", "keeps no conversation threads", "threads (beta) are not kept: the "
         "request carries the whole conversation (error.details tells the anthropic SDK's "
         "tool runner to send it so)"),
)
COUNT_TOKENS = _ANTHROPIC
RESPONSES = (
    *_renamed((*CONTEXT, *MESSAGES, *TOOLS), responses_field), NESTING,
    Rule("input", "answers no function_call",
         "a function_call_output answers a function_call earlier in input"),
    Rule("input", "Duplicate item found", "an item id names one item of the input and of "
         "what it continues (the conversation, or the previous response's chain)"),
    Rule("input", "no message to answer", "input must hold a message or a function call "
         "(reasoning items alone are dropped)"),
    Rule("reasoning.effort", "is not supported", "of the efforts only none is served"),
    Rule("reasoning.effort", "not single tokens",
         "a reasoning effort of none needs reasoning markers that are single tokens"),
    Rule("include", "is not supported", "of the include values only "
         "message.output_text.logprobs and reasoning.encrypted_content are served"),
    Rule("input", "could not be decrypted", "a reasoning item's encrypted_content is one "
         "this server (or a replica with the same FP8SERVE_THINKING_SIGNATURE_KEY) made"),
    Rule("top_logprobs", "needs include", "top_logprobs takes effect with include "
         "message.output_text.logprobs"),
    Rule("reasoning.summary", "is not supported", "reasoning summaries are not written"),
    Rule("reasoning.generate_summary", "is not supported",
         "reasoning summaries are not written"),
    Rule("previous_response_id", "not found", "previous_response_id names a response this "
         "server stored for the same API key and still keeps"),
    Rule("store", "stores no responses", "store true needs a server that keeps responses "
         "(--responses-store-mib above 0)"),
    Rule("background", "needs the response stored", "background true needs the response "
         "stored (store true or left out, on a server that keeps responses)"),
    Rule("previous_response_id", "is still running", "previous_response_id names a "
         "response that has finished (not a running background one)"),
    Rule("conversation", "not served here", "conversations need a server that keeps them "
         "(--conversations-store-mib above 0)"),
    Rule("conversation", "not found", "conversation names a conversation of the same API "
         "key that the server still keeps"),
    Rule("conversation", "cannot be combined with previous_response_id",
         "conversation and previous_response_id are exclusive"),
)
CONVERSATIONS = (
    Rule("conversation", "not served here", "conversations need a server that keeps them "
         "(--conversations-store-mib above 0)"),
    Rule("items", "answers no function_call", "a function_call_output answers a "
         "function_call earlier in items or in the conversation"),
    Rule("items", "Duplicate item found", "an item id names one item of the items and of "
         "the conversation"),
    Rule("items", "could not be decrypted", "a reasoning item's encrypted_content is one "
         "this server (or a replica with the same FP8SERVE_THINKING_SIGNATURE_KEY) made"),
    Rule("item_id", "whose output is in the conversation", "a function_call goes after "
         "its function_call_output"),
    Rule("items", "over the store's budget", "one conversation fits the store's budget "
         "(--conversations-store-mib)"), NESTING,
)
# a query parameter given twice (a route would read one of them)
QUERY_ONCE = Rule("", "is given twice", "a query parameter is given once (a list as "
                  "name[])")
STORED_CHAT = (
    Rule("after", "is no", "after names an entry of the list"),
    Rule("", "is not a filter of this list", "the list's filters are limit, order, after, "
         "model and metadata[KEY]"),
    Rule("", "is not supported here", "a stored completion's messages page with limit, "
         "order and after"), QUERY_ONCE,
)
# a route on one stored chat completion or one conversation: no query parameter
NO_QUERY = (Rule("", "takes no query parameter", "the route takes no query parameter"),
            QUERY_ONCE)
MODELS = (Rule("after_id", "not a served model", "a page cursor names a served model"),
          Rule("before_id", "not a served model", "a page cursor names a served model"),
          Rule("before_id", "not both", "a page goes after one cursor or before one"),
          Rule("", "is not supported here", "the model list pages with limit, after_id and "
               "before_id"), QUERY_ONCE)
CONVERSATION_ITEMS = (
    *CONVERSATIONS,
    Rule("after", "is no item", "after names an item of the conversation"),
    Rule("include", "is not supported here", "items are returned whole"),
    Rule("before", "is not supported here", "item lists page with limit, order and after"),
    QUERY_ONCE,
)


_UNSERVED_QUERY = "stored responses are returned whole, with what their request included"
STORED_QUERY = (
    Rule("stream", "is streamed again", "stream=true streams a background response created "
         "with stream (stream=false returns any response whole)"),
    Rule("starting_after", "is not an event sequence number",
         "starting_after is an integer, 0 or more"),
    Rule("starting_after", "takes effect with stream", "starting_after needs stream=true"),
    Rule("starting_after", "is past the last event", "starting_after names an event the "
         "response has sent (its sequence_number)"),
    Rule("", "is not supported here", _UNSERVED_QUERY), QUERY_ONCE,
)
INPUT_ITEMS = (
    Rule("after", "is no input item", "after names an input item of the response"),
    Rule("", "is not supported here", _UNSERVED_QUERY), QUERY_ONCE,
)
CANCEL = (
    Rule("response_id", "only background responses", "only background responses can be "
         "cancelled"),
    Rule("response_id", "has already ended", "a background response that has completed, "
         "failed or ended incomplete is not cancelled (a cancelled one is returned as is)"),
    *NO_QUERY,
)


def describe(rules: tuple[Rule, ...]) -> str:
    """The rules as Markdown lines for a 400's description."""
    seen: dict[str, None] = {}
    for r in rules:
        seen.setdefault(f"- `{r.param}`: {r.why}", None)
    return "\n".join(seen)
