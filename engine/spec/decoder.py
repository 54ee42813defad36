"""The engine's side of speculation: who may draft this step, how many tokens, and what
verification kept (counted with vLLM's meanings).

A sequence drafts when the step runs at most ``disable_by_batch_size`` sequences, its
policy finds a draft length that pays given its acceptance so far and what a row costs in
a step of this many sequences (engine/spec/policy.py, engine/spec/cost.py: fitted from the
decode steps the engine times), and its limits leave room: drafting k tokens can append
k + 1, so k <= max_tokens - outputs - 1, and the drafts' positions must stay below
max_model_len. A constrained sequence (a grammar or a thinking budget,
engine/spec/constraint.py) drafts the same way: its draft opens with the tokens its
constraints force, the proposer continues after them, the proposal is cut before the first
token the constraints reject, and forced tokens after it fill what room is left. A
constraint that fails (a matcher in an error state) only costs its sequence the draft: the
step's sampling then ends that request, as it would without speculation.

Two sources of drafts: ``--speculative-config``'s n-gram lookup (``config``; None: off) for
every sequence, and a request's predicted output (engine/spec/prediction.py) for the
sequences that came with one, with or without the config. A sequence with a prediction
drafts up to PREDICTION_DRAFT_TOKENS from it and falls back to the n-gram lookup (within
the config's length) where the prediction has nothing to offer. What verification kept of
the prediction's tokens is counted per request (:meth:`SpecDecoder.verified`; OpenAI's
``accepted_prediction_tokens`` / ``rejected_prediction_tokens``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from engine.spec.config import SpeculativeConfig
from engine.spec.constraint import DraftConstraint
from engine.spec.cost import StepCost
from engine.spec.ngram import NgramProposer
from engine.spec.policy import DraftPolicy
from engine.spec.prediction import PredictionProposer
from engine.spec.proposer import DraftInput, Proposer

log = logging.getLogger(__name__)

# the most tokens one draft takes from a prediction; the policy (engine/spec/policy.py)
# drafts fewer where acceptance and the measured row cost say more would not pay
PREDICTION_DRAFT_TOKENS = 16


@dataclass(slots=True)
class SpecStats:
    """Totals since start (vLLM's spec_decode counters): drafts verified, tokens they
    proposed, tokens accepted, and accepted tokens by draft position (0 = first)."""

    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    num_forced_tokens: int = 0  # draft tokens a constraint forced (no lookup)
    num_cut_tokens: int = 0  # proposed tokens a constraint cut before verification
    num_prediction_tokens: int = 0  # draft tokens taken from predictions and verified
    num_accepted_prediction_tokens: int = 0  # of those, accepted
    # per grammar kind ("none", "thinking", engine.structured.spec.KINDS): [drafts,
    # draft tokens, accepted tokens]
    by_grammar: dict[str, list[int]] = field(default_factory=dict)

    @property
    def acceptance_rate(self) -> float:
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens emitted per verified draft (accepted + the one sampled after them)."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 0.0


@dataclass(frozen=True, slots=True)
class DraftLimits:
    """What the engine knows of one decoding sequence when it may draft."""

    seq_id: int
    prompt_ids: Sequence[int]
    output_ids: Sequence[int]
    max_tokens: int  # the request's output budget (engine LiveRequest.max_tokens)
    constraint: DraftConstraint | None = None  # its grammar / thinking budget, if any
    prediction: Sequence[int] = ()  # its predicted output's tokens (Request.prediction_ids)


class SpecDecoder:
    def __init__(self, config: SpeculativeConfig | None, max_model_len: int,
                 proposer: Proposer | None = None) -> None:
        self.config = config
        self.max_model_len = max_model_len
        # the n-gram lookup (or a stand-in's) of --speculative-config; None without one
        self.proposer: Proposer | None = proposer or (
            None if config is None
            else NgramProposer(config.prompt_lookup_min, config.prompt_lookup_max))
        self.predictions = PredictionProposer()
        self._k = 0 if config is None else config.num_speculative_tokens
        self.stats = SpecStats(accepted_per_pos=[0] * max(self._k, PREDICTION_DRAFT_TOKENS))
        self._policy: dict[int, DraftPolicy] = {}
        self.cost = StepCost()
        self._share = 0.0  # the row share drafts of the current step were decided with
        # seq_id -> (first, count): where this step's draft holds its prediction's tokens
        self._from_prediction: dict[int, tuple[int, int]] = {}

    def may_draft(self, predicted: bool) -> bool:
        """Whether a sequence (with a prediction or not) can ever draft here."""
        return predicted or self._k > 0

    def room(self, s: DraftLimits) -> int:
        """The most tokens ``s`` may draft now (0: none)."""
        num_out = len(s.output_ids)
        num_tokens = len(s.prompt_ids) + num_out
        k = max(self._k, PREDICTION_DRAFT_TOKENS if s.prediction else 0)
        return max(0, min(k, s.max_tokens - num_out - 1, self.max_model_len - num_tokens))

    def drafts(self, seqs: Sequence[DraftLimits], num_running: int
               ) -> list[tuple[int, ...]]:
        """One proposal per sequence (possibly empty), within its room."""
        out: list[tuple[int, ...]] = [() for _ in seqs]
        self._from_prediction.clear()
        cap = None if self.config is None else self.config.disable_by_batch_size
        if cap is not None and num_running > cap:
            return out
        self._share = share = self.cost.row_share(len(seqs))
        try:
            asks = self._asks(seqs, share, out)
            for i, a, p, predicted in self._propose(asks):
                s = seqs[i]
                try:
                    kept, tail = self._constrained(s.constraint, tuple(p[:a.max_tokens]),
                                                   a.max_tokens)
                except Exception:  # noqa: BLE001 - a failing matcher: no draft (module doc)
                    log.warning("draft constraint failed", exc_info=True)
                    out[i] = ()
                    continue
                if predicted and kept:
                    self._from_prediction[s.seq_id] = (len(out[i]), len(kept))
                out[i] += kept + tail
        finally:
            for s in seqs:
                if s.constraint is not None:
                    s.constraint.release()
        return out

    def _propose(self, asks: list[tuple[int, DraftInput]]
                 ) -> list[tuple[int, DraftInput, tuple[int, ...], bool]]:
        """(index, ask, proposal, whether it came from the prediction) per ask: the
        prediction's where it has one, else the n-gram lookup's (within the config's K)."""
        got: dict[int, tuple[DraftInput, tuple[int, ...], bool]] = {}
        predicted = [(i, a) for i, a in asks if a.prediction]
        if predicted:
            props = self.predictions.propose([a for _, a in predicted])
            for (i, a), p in zip(predicted, props, strict=True):
                if p:
                    got[i] = (a, tuple(p), True)
        if self.proposer is not None:
            rest = []
            for i, a in asks:
                k = min(a.max_tokens, self._k - len(a.prefix))
                if i not in got and k > 0:
                    rest.append((i, a if k == a.max_tokens else replace(a, max_tokens=k)))
            if rest:
                props = self.proposer.propose([a for _, a in rest])
                for (i, a), p in zip(rest, props, strict=True):
                    got[i] = (a, tuple(p), False)
        return [(i, *got[i]) for i, _ in asks if i in got]

    def _asks(self, seqs: Sequence[DraftLimits], share: float,
              out: list[tuple[int, ...]]) -> list[tuple[int, DraftInput]]:
        """What to ask the proposer for each sequence that drafts (by its index in
        ``seqs``); out[i] gets the tokens its constraints force first."""
        asks = []
        for i, s in enumerate(seqs):
            k = self.room(s)
            if k:
                k = self._policy.setdefault(s.seq_id, DraftPolicy()).length(share, k)
            if not k:
                continue
            try:
                out[i] = head = () if s.constraint is None else s.constraint.forced(k)
            except Exception:  # noqa: BLE001 - a failing matcher: no draft (module doc)
                log.warning("draft constraint failed", exc_info=True)
                continue
            self.stats.num_forced_tokens += len(head)
            if len(head) < k:
                asks.append((i, DraftInput(s.seq_id, s.prompt_ids, s.output_ids,
                                           k - len(head), head, s.prediction)))
        return asks

    def _constrained(self, c: DraftConstraint | None, proposal: tuple[int, ...],
                     room: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(``proposal`` cut where ``c`` rejects it, the forced tokens after it up to
        ``room``)."""
        if c is None:
            return proposal, ()
        kept = c.admit(proposal)
        tail = c.forced(room - len(kept))
        self.stats.num_cut_tokens += len(proposal) - len(kept)
        self.stats.num_forced_tokens += len(tail)
        return kept, tail

    def verified(self, seq_id: int, num_drafted: int, num_accepted: int,
                 grammar: str = "none") -> tuple[int, int]:
        """A draft of ``num_drafted`` tokens was verified; its first ``num_accepted``
        were kept. ``grammar``: the sequence's grammar kind (SpecStats.by_grammar).
        Returns (accepted, rejected) of the draft's tokens that came from the sequence's
        prediction (a token past the first rejection counts as rejected)."""
        s = self.stats
        s.num_drafts += 1
        s.num_draft_tokens += num_drafted
        s.num_accepted_tokens += num_accepted
        row = s.by_grammar.setdefault(grammar, [0, 0, 0])
        row[0], row[1], row[2] = row[0] + 1, row[1] + num_drafted, row[2] + num_accepted
        for pos in range(num_accepted):
            s.accepted_per_pos[pos] += 1
        self._policy.setdefault(seq_id, DraftPolicy()).record(num_accepted, num_drafted,
                                                              self._share)
        first, count = self._from_prediction.pop(seq_id, (0, 0))
        count = max(0, min(count, num_drafted - first))  # the scheduler may cut a draft
        accepted = max(0, min(count, num_accepted - first))
        s.num_prediction_tokens += count
        s.num_accepted_prediction_tokens += accepted
        return accepted, count - accepted

    def step_timed(self, num_rows: int, seconds: float) -> None:
        """A decode step (no prompt tokens) of ``num_rows`` token rows, drafts included,
        took ``seconds`` (model, sampling, verification and outputs)."""
        self.cost.observe(num_rows, seconds)

    def release(self, seq_id: int) -> None:
        self._policy.pop(seq_id, None)
        self.predictions.release(seq_id)
        if self.proposer is not None:
            self.proposer.release(seq_id)
