"""Continuous batching: which sequences run this step, and how many tokens of each.

Policy, each step, under a token budget of ``max_num_batched_tokens``:

1. Decodes first: every running sequence with exactly one uncomputed token gets a
   one-token chunk, so running streams keep flowing however long a new prompt is.
2. Prefill continuations: running sequences still prefilling get the next chunk of
   their prompt (chunked prefill), oldest first, as far as the budget reaches.
3. Admission: waiting requests (FIFO) are admitted while ``len(running) < max_num_seqs``,
   budget remains and free KV blocks cover their first chunk. A waiting request that does
   not fit blocks the ones behind it (no overtaking: FIFO fairness). With a prefix cache
   (engine/kv/prefix_cache.py), an admitted request first takes the cached blocks that
   match its leading tokens and starts computing after them: the budget and the free
   blocks it needs count only the tokens still to compute.

Priority scheduling (``policy="priority"``, vLLM's ``--scheduling-policy priority``):
every order above is by (``priority``, arrival) instead, lower values first: the waiting
queue (a preempted request goes back to its place in it), admission and decodes (at most
one prompt is mid-prefill at a time, the last one admitted); and the sequence preempted
on KV exhaustion is the running one with the largest (priority, arrival) not yet
scheduled this step. A waiting request never preempts a running one to be admitted (as
vLLM). Under ``"fcfs"`` every request's priority is 0 and the orders are the arrival
orders above.

With ``max_prefill_tokens_with_decodes`` set, a step that carries decodes gives steps 2 and
3 at most that many tokens: a long prompt then reaches the streams already running as
several shorter steps instead of one that stalls them all (inter-token latency), while a
step without decodes still uses the whole budget. None (the server's 0) means no cap, as
in vLLM.

KV exhaustion: when a running sequence needs a block and none is free, the most recently
admitted running sequence that is not yet scheduled this step is *preempted by
recompute*: its blocks are freed, ``num_computed`` drops to 0 and it goes back to the
front of the queue; later its prompt plus the tokens generated so far are prefilled again
and generation continues where it stopped (its output stream sees nothing). If the needing
sequence is itself the newest, it is the one preempted. No admission happens in a step
that preempted. Requests that could never fit (prompt + max_tokens needs more blocks than
the whole cache) are refused by :meth:`Scheduler.check_fits` before they are queued.

Speculative decoding (engine/spec/): with a ``drafter``, after step 1 the decodes are
offered draft tokens; a decode that takes k of them runs a 1 + k token chunk whose rows all
give logits. Drafts come out of the budget left after every decode got its one token, and
take only free blocks (a draft never preempts anything). After verification the sequence's
``num_computed`` covers only the kept tokens; the next schedule releases the blocks past
what its tokens need (:meth:`BlockAllocator.shrink`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from engine.batch import BatchInputs, LogitsWanted, SeqChunk
from engine.kv.block_allocator import BlockAllocator
from engine.kv.prefix_cache import PrefixCache
from engine.request import Request, RequestStatus

SCHEDULING_POLICIES = ("fcfs", "priority")


def _rank(req: Request) -> tuple[int, int]:
    """A request's place under priority scheduling: lower first."""
    return req.priority, req.seq_id


class KvCapacityError(ValueError):
    """The request can never fit in the KV cache, whatever else is running."""


@dataclass(frozen=True, slots=True)
class SchedulerOutput:
    batch: BatchInputs
    requests: tuple[Request, ...]  # requests[i] runs batch.chunks[i]
    preempted: tuple[Request, ...] = ()
    num_decodes: int = 0  # the first num_decodes chunks are one-token decodes
    # prefix cache lookups of this step's admissions, in tokens (vLLM's meaning): the
    # tokens of the requests that looked, and those found cached; a preempted request's
    # re-admission counts apart (vLLM's preempted_queries / preempted_hits), so the hit
    # rate is the one of the prompts the clients sent
    cache_queries: int = 0
    cache_hits: int = 0
    num_draft_tokens: int = 0  # speculative draft tokens in the decode chunks
    preempted_cache_queries: int = 0
    preempted_cache_hits: int = 0

    @property
    def num_prefill_tokens(self) -> int:
        """Prompt (prefill or recompute) tokens of the step."""
        return self.batch.num_tokens - self.num_decodes - self.num_draft_tokens

    def logit_spans(self) -> list[tuple[int, int]]:
        """For each chunk, (first row, number of rows) of its logits in the runner output
        (rows are in chunk order, engine/batch.py); a chunk's last row is the one a
        sample is drawn from."""
        spans: list[tuple[int, int]] = []
        row = 0
        for chunk in self.batch.chunks:
            n = chunk.num_logit_rows
            spans.append((row, n))
            row += n
        return spans


class Scheduler:
    def __init__(self, allocator: BlockAllocator, max_num_seqs: int,
                 max_num_batched_tokens: int,
                 max_prefill_tokens_with_decodes: int | None = None,
                 prefix_cache: PrefixCache | None = None,
                 drafter: Callable[[list[Request]], list[tuple[int, ...]]] | None = None,
                 policy: str = "fcfs") -> None:
        if policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling policy {policy!r} is not one of "
                             f"{', '.join(SCHEDULING_POLICIES)}")
        self.allocator = allocator
        self.by_priority = policy == "priority"
        # decodes -> one proposal each (engine/spec/decoder.py); None = no speculation
        self.drafter = drafter
        self.prefix_cache = prefix_cache
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_prefill_tokens_with_decodes = max_prefill_tokens_with_decodes
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # admission order: oldest first

    @property
    def num_unfinished(self) -> int:
        return len(self.waiting) + len(self.running)

    def check_fits(self, num_prompt: int, max_tokens: int) -> None:
        need = self.allocator.blocks_for(num_prompt + max_tokens)
        if need > self.allocator.num_blocks:
            cap = self.allocator.num_blocks * self.allocator.block_size
            raise KvCapacityError(f"prompt ({num_prompt} tokens) + max_tokens ({max_tokens}) "
                                  f"exceeds the KV cache capacity of {cap} tokens")

    def add(self, req: Request) -> None:
        req.status = RequestStatus.WAITING
        self._enqueue(req, front=False)

    def _enqueue(self, req: Request, front: bool) -> None:
        """FCFS: a new request goes last, a preempted one first (it arrived before every
        waiting one); priority: both go to their rank's place."""
        if not self.by_priority:
            (self.waiting.appendleft if front else self.waiting.append)(req)
            return
        at = len(self.waiting)
        while at > 0 and _rank(self.waiting[at - 1]) > _rank(req):
            at -= 1
        self.waiting.insert(at, req)

    def remove(self, req: Request) -> None:
        """Drop a request (finished, aborted or failed) and free its KV blocks."""
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._release(req)

    def _release(self, req: Request) -> None:
        """Free ``req``'s blocks, registering its computed full ones in the cache first."""
        if self.prefix_cache is not None:
            self.prefix_cache.commit(req)
        self.allocator.free(req.block_table)
        req.num_committed_blocks = 0

    def reset_prefix_cache(self) -> int:
        """Forget every cached block (running requests keep theirs and go on registering
        the blocks they complete from now on); returns how many were dropped."""
        return self.allocator.reset_cache()

    def schedule(self) -> SchedulerOutput | None:
        budget = self.max_num_batched_tokens
        picked: list[tuple[Request, int]] = []
        preempted: list[Request] = []
        for req in self.running:
            req.spec_ids = ()
            if self.drafter is not None:  # the tail a rejected draft was written into
                self.allocator.shrink(req.block_table, req.num_tokens)
            if self.prefix_cache is not None:  # what the last step computed is shareable
                self.prefix_cache.commit(req)
        decodes = [r for r in self.running if r.is_decoding]
        prefills = [r for r in self.running if not r.is_decoding]
        if self.by_priority:
            decodes.sort(key=_rank)
        budget = self._pick(decodes, budget, picked, preempted)
        num_decodes = len(picked)
        num_drafts = 0
        if self.drafter is not None and num_decodes and budget:
            budget, num_drafts = self._draft(picked, budget)
        cap = self.max_prefill_tokens_with_decodes
        if num_decodes and cap is not None:  # the step carries decodes: prefill gets <= cap
            budget = min(budget, cap)
        budget = self._pick(prefills, budget, picked, preempted)
        lookups = self._admit(budget, picked) if not preempted else (0, 0, 0, 0)
        if not picked:
            return None
        chunks = tuple(self._chunk(req, n) for req, n in picked)
        return SchedulerOutput(BatchInputs(chunks), tuple(r for r, _ in picked),
                               tuple(preempted), num_decodes, lookups[0], lookups[1],
                               num_drafts, lookups[2], lookups[3])

    def _draft(self, picked: list[tuple[Request, int]], budget: int) -> tuple[int, int]:
        """Give the picked decodes the draft tokens the drafter proposes, as far as
        ``budget`` and the free blocks reach; returns (budget left, tokens drafted)."""
        reqs = [r for r, _ in picked]
        drafted = 0
        for i, (req, props) in enumerate(zip(reqs, self.drafter(reqs), strict=True)):
            k = self._fit_draft(req, min(len(props), budget))
            if k:
                req.spec_ids = tuple(props[:k])
                picked[i] = (req, 1 + k)
                budget -= k
                drafted += k
            if not budget:
                break
        return budget, drafted

    def _fit_draft(self, req: Request, k: int) -> int:
        """How many of ``k`` draft positions after the newest token ``req``'s blocks can
        hold, growing them only into free blocks."""
        if k <= 0:
            return 0
        start = req.num_computed + 1  # the newest token's position is reserved already
        if self.allocator.grow(req.block_table, start + k):
            return k
        room = len(req.block_table) * self.allocator.block_size - start
        return max(0, min(k, room))

    def _pick(self, reqs: list[Request], budget: int, picked: list[tuple[Request, int]],
              preempted: list[Request]) -> int:
        """Schedule the uncomputed tokens of running ``reqs`` in order as far as ``budget``
        reaches; returns what is left of it."""
        for req in reqs:
            if budget == 0:
                break
            if req.status is not RequestStatus.RUNNING:  # preempted earlier this step
                continue
            n = min(req.num_uncomputed, budget)
            if self._reserve(req, n, picked, preempted):
                picked.append((req, n))
                budget -= n
        return budget

    def _reserve(self, req: Request, n: int, picked: list[tuple[Request, int]],
                 preempted: list[Request]) -> bool:
        """Grow ``req``'s blocks for ``n`` more tokens, preempting newer sequences as
        needed. False when ``req`` itself had to be preempted."""
        scheduled = {id(r) for r, _ in picked}
        while not self.allocator.grow(req.block_table, req.num_computed + n):
            victims = [r for r in self.running if id(r) not in scheduled]
            # req itself is in victims, so this is never empty
            victim = max(victims, key=_rank) if self.by_priority else victims[-1]
            self._preempt(victim)
            preempted.append(victim)
            if victim is req:
                return False
        return True

    def _preempt(self, req: Request) -> None:
        self.running.remove(req)
        self._release(req)
        req.num_computed = 0
        req.num_preemptions += 1
        req.status = RequestStatus.WAITING
        self._enqueue(req, front=True)

    def _admit(self, budget: int, picked: list[tuple[Request, int]]
               ) -> tuple[int, int, int, int]:
        """Admit waiting requests in order; returns the prefix cache's (tokens looked up,
        tokens found) over the admitted ones, first admissions, then re-admissions."""
        lookups = [0, 0, 0, 0]
        while self.waiting and budget > 0 and len(self.running) < self.max_num_seqs:
            req = self.waiting[0]
            hits = self.prefix_cache.match(req) if self.prefix_cache is not None else []
            start = len(hits) * self.allocator.block_size
            n = min(req.num_tokens - start, budget)
            fresh = self.allocator.blocks_for(start + n) - len(hits)
            if fresh > self.allocator.num_free - sum(map(self.allocator.is_free, hits)):
                break
            self.waiting.popleft()
            self.allocator.share(req.block_table, hits)
            req.num_committed_blocks = len(hits)
            req.num_computed = start
            if not self.allocator.grow(req.block_table, start + n):
                raise AssertionError("free blocks were counted for this admission")
            if self.prefix_cache is not None and not req.wants_prompt_logprobs:
                at = 2 if req.num_preemptions else 0
                lookups[at] += req.num_tokens
                lookups[at + 1] += start
            if req.num_preemptions == 0:
                req.num_cached_tokens = start
            req.status = RequestStatus.RUNNING
            self.running.append(req)
            picked.append((req, n))
            budget -= n
        return lookups[0], lookups[1], lookups[2], lookups[3]

    @staticmethod
    def _chunk(req: Request, n: int) -> SeqChunk:
        start = req.num_computed
        drafts = req.spec_ids
        tokens = req.token_slice(start, start + n - len(drafts)) + drafts
        last = start + n - len(drafts) == req.num_tokens
        if req.wants_prompt_logprobs and start < len(req.prompt_ids):
            wanted = LogitsWanted.ALL  # every row: it scores the next prompt token
        elif drafts:
            wanted = LogitsWanted.ALL  # every row: it verifies the next draft token
        else:
            wanted = LogitsWanted.LAST if last else LogitsWanted.NONE
        embeds = None
        if req.images and start < len(req.prompt_ids):
            from engine.vision.prompt_image import chunk_embeds

            embeds = chunk_embeds(req.images, start, start + n)
        return SeqChunk(seq_id=req.seq_id, token_ids=tokens, start_pos=start,
                        block_table=tuple(req.block_table), logits=wanted, embeds=embeds,
                        num_draft=len(drafts), prompt_len=len(req.prompt_ids))
