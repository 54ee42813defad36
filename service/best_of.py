"""OpenAI's ``best_of`` on /v1/completions: best_of candidates per prompt, the n with the
highest sum of their tokens' logprobs returned, best first; and the refusal of ranking by
logprobs (best_of, use_beam_search) on a server whose reported logprobs are logits."""

from __future__ import annotations

from service.backend import ServingState
from service.collect import Choice
from service.errors import APIError
from service.schemas import CompletionRequest


def check_ranked_by_logprobs(state: ServingState, field: str) -> None:
    """A 400 naming ``field`` (use_beam_search, best_of: both rank outputs by their summed
    logprobs) on a server whose reported logprobs are logits (--logprobs-mode *_logits)."""
    mode = state.settings.logprobs_mode
    if mode.endswith("logits"):
        raise APIError(400, f"{field}: it ranks outputs by their log-probabilities, and "
                       f"this server reports logits in their place (--logprobs-mode {mode})",
                       field)


def check_best_of(state: ServingState, body: CompletionRequest) -> int:
    """Candidates per prompt: best_of (at least n; not with stream), else n."""
    best_of = body.best_of or body.n
    if best_of < body.n:
        raise APIError(400, f"best_of: {best_of} is less than n ({body.n}); it counts the "
                       "candidates the n choices are picked from", "best_of")
    if best_of > body.n and body.stream:
        raise APIError(400, "best_of: picking the best candidates needs them whole: not "
                       "with stream (or best_of equal to n)", "best_of")
    if best_of > body.n:
        check_ranked_by_logprobs(state, "best_of")
    return best_of


def best_choices(choices: list[Choice], best_of: int, n: int) -> list[Choice]:
    """Of each prompt's best_of candidates, the n with the highest sum of their tokens'
    logprobs, best first (ties: generation order)."""
    if best_of == n:
        return choices
    out: list[Choice] = []
    for start in range(0, len(choices), best_of):
        group = choices[start:start + best_of]
        out += sorted(group, key=lambda c: -sum(lp.logprob for lp in c.logprobs))[:n]
    return out
