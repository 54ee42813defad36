"""logits [B, V] fp32 -> next token ids [B] int64, batched, pure (no state between calls).

Processing order per row (OpenAI / vLLM definitions):
  0. the grammar mask (engine/structured/token_mask.py), constrained rows only: tokens
     the row's grammar forbids (and model padding ids past the tokenizer's vocabulary)
     are set to -inf, so no penalty, bias or temperature can bring them back;
  1. logit_bias added; then allowed_token_ids (every other id set to -inf) and bad_words
     (a banned sequence's last token set to -inf where the output ends with the rest of
     it; a one-token word always), vLLM's;
  2. min_tokens: while fewer than min_tokens outputs exist, stop_token_ids (and the EOS ids
     unless ignore_eos) are set to -inf;
  3. repetition_penalty r over tokens seen in prompt + output: positive logits are divided
     by r, negative ones multiplied by r (a biased logit too: (logit + bias) / r, vLLM's
     order);
  4. frequency_penalty f and presence_penalty p over output tokens:
     logit[t] -= f * count[t] + p * (count[t] > 0);
  5. the thinking budget (SamplingParams.thinking): when the output is inside a reasoning
     section and its reasoning tokens (counted on the output ids, as the reasoning parsers
     count them) have reached the budget, every token but the section's end token is set
     to -inf, so the next token closes it, greedy or sampled. A row whose end token is
     already -inf (its grammar forbids it) is left as it is: the grammar wins and the row
     never ends up with no token at all.
  -> these are the *processed logits*. Reported logprobs are log_softmax(processed logits):
     the model's distribution after penalties/bias/min_tokens/the thinking budget, before
     temperature and the top-k/top-p/min-p truncation (so they do not depend on the
     sampling temperature and sum to 1 over the vocabulary). vLLM's --logprobs-mode
     (LOGPROBS_MODES) picks others: raw_logprobs, log_softmax of the logits as they come
     (under the grammar mask, as vLLM applies it before its sampler); raw_logits and
     processed_logits, the logits themselves.
  6. temperature 0: argmax of the processed logits. Otherwise subtract the row's largest
     logit and divide by temperature (so a tiny temperature tends to greedy), then
     min_p (drop tokens whose probability < min_p * max probability), top_k, top_p
     (smallest prefix of the sorted distribution whose mass reaches top_p), then sample.

Each step is a pure function of the row's params, prompt and output ids (no state between
calls), so it stays exact under batching, preemption and recomputation; a verifier of draft
tokens gets the same masks by passing each position's output prefix as its row.

Cost: work is done only where a row asks for it. Logits are copied only when some row
needs penalties, a bias, the min_tokens mask or the thinking-budget mask; a batch of plain
greedy rows is one argmax per row of the input (:func:`row_argmax`). A row with a thinking
budget rescans its output ids each step (C-speed list scans, O(output length): about
0.5 ms at 16k output tokens on the development machine, against decode steps of tens of
ms). log_softmax runs only over the rows that asked for logprobs;
:attr:`SamplerOutput.logprobs` (every row's chosen-token logprob) is computed on first
access.

Sampling uses the exponential race: token = argmax(p / q), q ~ Exp(1) i.i.d., which draws
exactly from p. A row with its own ``torch.Generator`` draws its V exponentials from that
generator alone, so seeded output never depends on the other rows of the batch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from engine.config import LOGPROBS_MODES
from engine.sampling_params import SamplingParams, ThinkingBudget
from engine.structured.token_mask import TokenMask, apply_token_mask

TopLogprobs = tuple[list[int], list[float]]  # (token ids, logprobs), best first
# Extreme penalties and temperatures stay inside fp32: a factor is clamped to [TINY, MAX]
# and a logit that overflows to +-inf to +-MAX, so no row turns NaN; a reported logprob is at
# least LOGPROB_FLOOR (what OpenAI and vLLM report for an impossible token), never -inf.
F32_MAX, F32_TINY = torch.finfo(torch.float32).max, torch.finfo(torch.float32).tiny
LOGPROB_FLOOR = -9999.0


class NoTokenLeft(ValueError):
    """A row's filters leave no token to sample: its allowed_token_ids, bad_words, the
    stop tokens min_tokens holds back and its grammar exclude every one. The request's
    own input (a 400), never a token it excluded."""


def _check_tokens_left(x: torch.Tensor, params: Sequence[SamplingParams],
                       output_ids: Sequence[Sequence[int]]) -> None:
    """NoTokenLeft when a row whose token filters or min_tokens mask its logits has none
    left (a grammar alone always leaves one: its matcher raises GrammarDeadEnd first)."""
    rows = [i for i, (p, out) in enumerate(zip(params, output_ids, strict=True))
            if p.filters_tokens or len(out) < p.min_tokens]
    if not rows:
        return
    sub = x if len(rows) == x.shape[0] else x[rows]
    dead = [rows[j] for j in (sub.amax(dim=-1) == float("-inf")).nonzero()[:, 0].tolist()]
    if dead:
        p = params[dead[0]]
        fields = [name for name, on in (
            ("allowed_token_ids", p.allowed_token_ids is not None),
            ("bad_words", bool(p.bad_words_ids)),
            ("min_tokens (the stop tokens it holds back)", p.min_tokens > 0)) if on]
        raise NoTokenLeft("no token is left to sample: " + (
            ", ".join(fields) or "the filters") + " and the output's grammar, if any, "
            "exclude every token")


def _factor(values: list[float]) -> torch.Tensor:
    """[n, 1] fp32 per-row divisors/multipliers, clamped so none is 0 or inf."""
    return torch.tensor(values, dtype=torch.float64).clamp(F32_TINY, F32_MAX).float()[:, None]


@dataclass(frozen=True)
class SamplerOutput:
    token_ids: torch.Tensor  # [B] int64
    top_logprobs: list[TopLogprobs | None]  # per row; None when params.logprobs is None
    chosen_logprobs: list[float | None]  # per row; None when params.logprobs is None
    processed: torch.Tensor  # [B, V] fp32 processed logits; may alias the input: read only

    @cached_property
    def logprobs(self) -> torch.Tensor:
        """[B] fp32: logprob of each row's chosen token under its processed logits
        (computed on first access; rows that asked for logprobs report the same values
        through ``chosen_logprobs``)."""
        lp = torch.log_softmax(self.processed, dim=-1)
        return lp.gather(1, self.token_ids[:, None])[:, 0]


def apply_penalties(
    x: torch.Tensor,
    params: Sequence[SamplingParams],
    prompt_ids: Sequence[Sequence[int]],
    output_ids: Sequence[Sequence[int]],
) -> None:
    """In place on x [B, V] fp32: repetition, then frequency and presence penalties."""
    rows = [i for i, p in enumerate(params) if p.has_penalties]
    if not rows:
        return
    b, v = len(rows), x.shape[1]
    counts = torch.zeros(b, v, dtype=torch.float32)
    seen = torch.zeros(b, v, dtype=torch.bool)
    for j, i in enumerate(rows):
        out = torch.as_tensor(list(output_ids[i]), dtype=torch.long)
        counts[j].index_add_(0, out, torch.ones(len(out)))
        seen[j, torch.as_tensor(list(prompt_ids[i]), dtype=torch.long)] = True
    seen |= counts > 0
    idx = torch.as_tensor(rows)
    rep = _factor([params[i].repetition_penalty for i in rows])
    freq = torch.tensor([params[i].frequency_penalty for i in rows])[:, None]
    pres = torch.tensor([params[i].presence_penalty for i in rows])[:, None]
    if all(math.copysign(1.0, params[i].frequency_penalty) > 0
           and math.copysign(1.0, params[i].presence_penalty) > 0 for i in rows):
        _penalize_seen(x, rows, seen, counts, rep, freq, pres)
        return
    sub = x[idx]
    sub = _saturated(torch.where(seen, torch.where(sub > 0, sub / rep, sub * rep), sub), sub)
    sub = sub - freq * counts - pres * (counts > 0).float()
    x[idx] = sub


def _penalize_seen(x: torch.Tensor, rows: list[int], seen: torch.Tensor,
                   counts: torch.Tensor, rep: torch.Tensor, freq: torch.Tensor,
                   pres: torch.Tensor) -> None:
    """:func:`apply_penalties`' arithmetic on the seen tokens only, element for element the
    same operations (same bits); every other token of a penalized row is only saturated
    (+inf -> F32_MAX), which is what the dense formula does to it when the frequency and
    presence penalties are +0 or positive (x - (+0) is x, -0.0 included). The dense form
    ran about a dozen [rows, V] passes per step."""
    r, c = seen.nonzero(as_tuple=True)
    whole = len(rows) == x.shape[0] and rows == list(range(len(rows)))
    sub = x if whole else x[torch.as_tensor(rows)]
    vals = sub[r, c]
    cnt = counts[r, c]
    rr = rep[:, 0][r]
    y = _saturated(torch.where(vals > 0, vals / rr, vals * rr), vals)
    y = y - freq[:, 0][r] * cnt - pres[:, 0][r] * (cnt > 0).float()
    sub.clamp_(max=F32_MAX)
    sub[r, c] = y
    if not whole:
        x[torch.as_tensor(rows)] = sub


def _saturated(y: torch.Tensor, before: torch.Tensor) -> torch.Tensor:
    """y (a factor applied to ``before``) with what overflowed fp32 held at +-F32_MAX, so a
    row never becomes all -inf (no distribution: NaN); a -inf of ``before`` (a masked
    token) stays -inf."""
    return torch.where(before == float("-inf"), before, y.clamp(-F32_MAX, F32_MAX))


def apply_bias_and_min_tokens(
    x: torch.Tensor,
    params: Sequence[SamplingParams],
    output_ids: Sequence[Sequence[int]],
    eos_token_ids: frozenset[int],
) -> None:
    """In place on x [B, V] fp32: logit_bias, the token filters (allowed_token_ids,
    bad_words), then the min_tokens stop-token mask."""
    v = x.shape[1]
    for i, p in enumerate(params):
        if p.logit_bias:
            ids = torch.as_tensor(list(p.logit_bias.keys()), dtype=torch.long)
            x[i, ids] += torch.as_tensor(list(p.logit_bias.values()), dtype=torch.float32)
        if p.allowed_token_ids is not None:
            keep = torch.as_tensor([t for t in p.allowed_token_ids if t < v], dtype=torch.long)
            row = torch.full((v,), float("-inf"))
            row[keep] = x[i, keep]
            x[i] = row
        banned = _bad_word_ends(p.bad_words_ids, output_ids[i], v)
        if banned:
            x[i, torch.as_tensor(banned, dtype=torch.long)] = float("-inf")
        if len(output_ids[i]) < p.min_tokens:
            banned = set(p.stop_token_ids) | (set() if p.ignore_eos else set(eos_token_ids))
            banned_ids = [t for t in banned if t < v]
            if banned_ids:
                x[i, torch.as_tensor(banned_ids, dtype=torch.long)] = float("-inf")


def _bad_word_ends(words: Sequence[Sequence[int]], out: Sequence[int], v: int) -> list[int]:
    """The last token of each banned sequence whose other tokens end the output."""
    banned = []
    for w in words:
        head = len(w) - 1
        if w[-1] < v and (head == 0 or (len(out) >= head
                                        and list(out[len(out) - head:]) == list(w[:-1]))):
            banned.append(w[-1])
    return banned


def _index(ids: list[int], token: int, start: int) -> int:
    """The first position >= start of token in ids, else len(ids) (a C-speed scan)."""
    try:
        return ids.index(token, start)
    except ValueError:
        return len(ids)


def thinking_state(tb: ThinkingBudget, output_ids: Sequence[int]) -> tuple[bool, int]:
    """(whether the output ends inside a reasoning section, its reasoning tokens so far).
    The markers are not counted; an end outside a section and a start inside one change
    nothing (service/tool_calls/choice.py ReasoningCounter counts the same tokens)."""
    ids = output_ids if isinstance(output_ids, list) else list(output_ids)
    inside, pos, count, n = tb.starts_inside, 0, 0, len(ids)
    while pos < n:
        if not inside:
            pos = _index(ids, tb.start_token_id, pos) + 1
            inside = pos <= n
            continue
        end = _index(ids, tb.end_token_id, pos)
        stray = ids[pos:end].count(tb.start_token_id)  # a start inside: not reasoning
        count += end - pos - stray
        inside, pos = end == n, end + 1
    return inside, count


def thinking_rows(params: Sequence[SamplingParams],
                  output_ids: Sequence[Sequence[int]]) -> list[int]:
    """The rows whose open reasoning section has used up its budget."""
    rows = []
    for i, p in enumerate(params):
        if p.thinking is not None:
            inside, count = thinking_state(p.thinking, output_ids[i])
            if inside and count >= p.thinking.budget:
                rows.append(i)
    return rows


def apply_thinking_budget(x: torch.Tensor, params: Sequence[SamplingParams],
                          rows: Sequence[int]) -> None:
    """In place on x [B, V] fp32: in each of ``rows`` (:func:`thinking_rows`) every token
    but the row's end token becomes -inf, unless that token is -inf already."""
    for i in rows:
        end = params[i].thinking.end_token_id
        if end < x.shape[1] and x[i, end] != float("-inf"):
            kept = x[i, end].clone()
            x[i] = float("-inf")
            x[i, end] = kept


def truncate(
    y: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor
) -> torch.Tensor:
    """y [b, V] fp32 temperature-scaled logits; top_k [b] int64 (V = off); top_p, min_p [b]
    fp32. Returns y with every dropped token set to -inf (at least one token survives)."""
    if bool((min_p > 0).any()):
        probs = torch.softmax(y, dim=-1)
        thresh = min_p[:, None] * probs.max(dim=-1, keepdim=True).values
        y = y.masked_fill(probs < thresh, float("-inf"))
    v = y.shape[1]
    if not bool((top_k < v).any() or (top_p < 1).any()):
        return y
    fast = _truncate_by_values(y, top_k, top_p)
    if fast is not None:
        return fast
    sorted_y, order = y.sort(dim=-1, descending=True)
    drop = torch.arange(v)[None, :] >= top_k[:, None]
    sorted_y = sorted_y.masked_fill(drop, float("-inf"))
    sp = torch.softmax(sorted_y, dim=-1)
    mass_before = sp.cumsum(dim=-1) - sp
    drop |= (mass_before >= top_p[:, None]) & (top_p[:, None] < 1)
    drop[:, 0] = False
    sorted_y = sorted_y.masked_fill(drop, float("-inf"))
    return torch.empty_like(y).scatter_(-1, order, sorted_y)


def _truncate_by_values(y: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor
                       ) -> torch.Tensor | None:
    """:func:`truncate`'s top-k / top-p step without its full (value, index) sort, bit for
    bit: the drop mask is computed on the same sorted values (the k_max + 1 best of
    ``topk`` when every row has a top_k, else a values-only sort), so softmax and cumsum
    see the same tensor. When each row keeps a prefix of its sorted values and no tie
    straddles the kept boundary, the kept tokens are those at or above the last kept value
    whatever order the sort gave ties; otherwise None (the caller sorts). A sort of the
    whole vocabulary costs several ms per row; topk of k_max + 1 a fraction of one."""
    b, v = y.shape
    if bool(torch.isnan(y).any()):
        return None
    k_max = int(top_k.max())
    if k_max < v:
        n = k_max + 1  # one past the largest top_k: every row's boundary is inside
        head = y.topk(n, dim=-1).values
        vals = torch.cat((head, head.new_full((b, v - n), float("-inf"))), dim=1)
    else:
        vals = torch.from_numpy(np.ascontiguousarray(np.sort(y.numpy(), axis=-1)[:, ::-1]))
    pos = torch.arange(v)[None, :]
    drop = pos >= top_k[:, None]
    sorted_y = vals.masked_fill(drop, float("-inf"))
    sp = torch.softmax(sorted_y, dim=-1)
    mass_before = sp.cumsum(dim=-1) - sp
    drop |= (mass_before >= top_p[:, None]) & (top_p[:, None] < 1)
    drop[:, 0] = False
    kept = (~drop).sum(dim=1)  # [b] >= 1
    if not bool(((pos < kept[:, None]) != drop).all()):
        return None  # a row's kept positions are not a prefix
    last = vals.gather(1, (kept - 1)[:, None])  # [b, 1] the last kept value
    nxt = vals.gather(1, kept.clamp(max=v - 1)[:, None])
    if bool(((kept < v)[:, None] & (nxt == last)).any()):
        return None  # a tie across the boundary: which token stays is the sort's order
    return y.masked_fill(y < last, float("-inf"))


def _exponential_race(
    probs: torch.Tensor, generators: Sequence[torch.Generator | None]
) -> torch.Tensor:
    """probs [b, V] fp32 -> [b] int64; row i draws its noise from generators[i] alone."""
    q = torch.empty_like(probs)
    unseeded = [i for i, g in enumerate(generators) if g is None]
    if unseeded:
        q[unseeded] = torch.empty(len(unseeded), probs.shape[1]).exponential_()
    for i, g in enumerate(generators):
        if g is not None:
            q[i].exponential_(generator=g)
    return row_argmax(probs / q.clamp_(min=1e-30))


def _sample_random(
    x: torch.Tensor,
    rows: list[int],
    params: Sequence[SamplingParams],
    generators: Sequence[torch.Generator | None],
) -> torch.Tensor:
    v = x.shape[1]
    ps = [params[i] for i in rows]
    temp = _factor([p.temperature for p in ps])
    # top_k past the vocabulary is off; clamped before the tensor, as it may exceed int64
    top_k = torch.tensor([min(p.top_k, v) if p.top_k_enabled else v for p in ps],
                         dtype=torch.long)
    top_p = torch.tensor([p.top_p for p in ps], dtype=torch.float32)
    min_p = torch.tensor([p.min_p for p in ps], dtype=torch.float32)
    xr = x[rows]
    # the row's largest logit first (softmax is shift-invariant): a tiny temperature then
    # sends every other logit to -F32_MAX, not the positive ones to +F32_MAX (a near-uniform
    # draw among them), so it tends to greedy as it should
    y = truncate(_saturated((xr - xr.amax(dim=-1, keepdim=True)) / temp, xr), top_k, top_p,
                 min_p)
    return _exponential_race(torch.softmax(y, dim=-1), [generators[i] for i in rows])


def top_logprobs(logprobs: torch.Tensor, k: int) -> TopLogprobs:
    """logprobs [V] fp32 -> the k best (ids, logprobs)."""
    if k <= 0:
        return ([], [])
    vals, ids = logprobs.topk(min(k, logprobs.shape[0]))
    return (ids.tolist(), vals.tolist())


def needs_processing(params: Sequence[SamplingParams],
                     output_ids: Sequence[Sequence[int]]) -> bool:
    """True when some row's logits change before sampling (penalties, bias, min_tokens)."""
    return any(p.has_penalties or p.logit_bias or p.filters_tokens or len(out) < p.min_tokens
               for p, out in zip(params, output_ids, strict=True))


def row_argmax(x: torch.Tensor) -> torch.Tensor:
    """int64 [B]: the argmax of each row of x [B, V], as ``x.argmax(dim=-1)`` (the first
    index of the row's largest value, NaN counting as largest), taken one contiguous row
    at a time. ATen reduces a few long rows along the last dim by splitting the rows
    across threads: at B = 8, V = 49152 on 2 threads that took 2-12 ms a step against
    0.35 ms row by row (the forward pass of such a step: about 40 ms)."""
    if x.shape[0] <= 1:
        return x.argmax(dim=-1)
    return torch.stack([row.argmax() for row in x])


def _logprob_rows(x: torch.Tensor, tokens: torch.Tensor, params: Sequence[SamplingParams],
                  logits: bool = False
                  ) -> tuple[list[TopLogprobs | None], list[float | None]]:
    """Top and chosen logprobs of the rows whose params ask for logprobs (None elsewhere);
    ``logits``: the rows' values themselves (the *_logits modes)."""
    b = x.shape[0]
    tops: list[TopLogprobs | None] = [None] * b
    chosen: list[float | None] = [None] * b
    rows = [i for i, p in enumerate(params) if p.logprobs is not None]
    if not rows:
        return tops, chosen
    sub = x if len(rows) == b else x[rows]
    lp = (sub if logits else torch.log_softmax(sub, dim=-1)).clamp(min=LOGPROB_FLOOR)
    picked = lp.gather(1, tokens[rows][:, None])[:, 0].tolist()
    for j, i in enumerate(rows):
        tops[i] = top_logprobs(lp[j], params[i].logprobs)
        chosen[i] = picked[j]
    return tops, chosen


def sample(
    logits: torch.Tensor,
    params: Sequence[SamplingParams],
    prompt_ids: Sequence[Sequence[int]],
    output_ids: Sequence[Sequence[int]],
    generators: Sequence[torch.Generator | None],
    eos_token_ids: Iterable[int] = (),
    mask: TokenMask | None = None,
    logprobs_mode: str = "processed_logprobs",
) -> SamplerOutput:
    """logits [B, V] fp32 (not modified) -> SamplerOutput; see the module docstring.
    mask: the grammar masks of the constrained rows (others untouched, bit for bit).
    logprobs_mode: one of LOGPROBS_MODES, what the reported logprobs are."""
    b = logits.shape[0]
    if not (len(params) == len(prompt_ids) == len(output_ids) == len(generators) == b):
        raise ValueError(f"sample: {b} logit rows but {len(params)} params, "
                         f"{len(prompt_ids)} prompts, {len(output_ids)} outputs, "
                         f"{len(generators)} generators")
    x = logits.to(torch.float32)
    masked = mask is not None and bool(mask.rows)
    thinking = thinking_rows(params, output_ids)
    raw = x
    if masked or thinking or needs_processing(params, output_ids):
        x = x.clone() if x is logits else x
        if masked:
            apply_token_mask(x, mask)
        if logprobs_mode.startswith("raw") and any(p.logprobs is not None for p in params):
            raw = x.clone()
        apply_bias_and_min_tokens(x, params, output_ids, frozenset(eos_token_ids))
        apply_penalties(x, params, prompt_ids, output_ids)
        apply_thinking_budget(x, params, thinking)
        _check_tokens_left(x, params, output_ids)
    tokens = row_argmax(x)
    rows = [i for i, p in enumerate(params) if not p.greedy]
    if rows:
        tokens[rows] = _sample_random(x, rows, params, generators)
    tops, chosen = _logprob_rows(raw if logprobs_mode.startswith("raw") else x, tokens,
                                 params, logprobs_mode.endswith("logits"))
    return SamplerOutput(tokens, tops, chosen, x)


class Sampler:
    """:func:`sample` bound to a model's EOS ids (needed for min_tokens)."""

    def __init__(self, eos_token_ids: Iterable[int] = (),
                 logprobs_mode: str = "processed_logprobs") -> None:
        if logprobs_mode not in LOGPROBS_MODES:
            raise ValueError(f"logprobs mode {logprobs_mode!r} not in {LOGPROBS_MODES}")
        self.eos_token_ids = frozenset(eos_token_ids)
        self.logprobs_mode = logprobs_mode

    def __call__(self, logits, params, prompt_ids, output_ids, generators,
                 mask: TokenMask | None = None) -> SamplerOutput:
        return sample(logits, params, prompt_ids, output_ids, generators,
                      self.eos_token_ids, mask, self.logprobs_mode)


def make_generator(seed: int | None) -> torch.Generator | None:
    """The per-request generator: None for unseeded requests (global RNG)."""
    if seed is None:
        return None
    # any integer, taken modulo 2**64 (a negative seed as its two's complement). torch's CPU
    # generator (mt19937) keeps only the low 32 bits of its seed, so the high 32 are folded
    # in (times an odd constant): seeds below 2**32 draw as torch.manual_seed draws, and
    # seeds that differ only above bit 31 (0 and 2**32) draw differently
    s = seed % 2**64
    return torch.Generator().manual_seed((s ^ ((s >> 32) * 0x9E3779B1)) & 0xFFFFFFFF)


def token_logprobs(
    logits: torch.Tensor, target_ids: Sequence[int], k: int
) -> tuple[list[float], list[TopLogprobs], list[int]]:
    """Prompt logprobs: logits [T, V] fp32 where row t predicts target_ids[t] -> the logprob
    of each target (raw log_softmax, no penalties), its k best alternatives, and its rank
    (1 + the number of ids strictly likelier, vLLM's meaning)."""
    lp = torch.log_softmax(logits.to(torch.float32), dim=-1)
    tgt = torch.as_tensor(list(target_ids), dtype=torch.long)
    chosen = lp.gather(1, tgt[:, None])
    ranks = ((lp > chosen).sum(dim=1) + 1).tolist()
    return (chosen[:, 0].tolist(), [top_logprobs(lp[t], k) for t in range(lp.shape[0])],
            ranks)
