"""Prometheus metrics, one registry per app (never the process-global default, so tests can
build several apps). Request metrics are pushed by the engine thread through the
:class:`EngineObserver` hooks; engine gauges and kernel metrics are read at scrape time
from the engine stats and the kernel report by a collector."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, Info
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from engine.request import (
    EngineUnavailableError,
    FinishReason,
    InvalidRequestError,
    QueueFullError,
)
from engine.stream import EngineObserver
from engine.structured.spec import KINDS as GRAMMAR_KINDS
from service.kernel_metrics import kernel_families

# the spec_decode counters' grammar label: what constrained the drafted sequence
SPEC_GRAMMARS = ("none", "thinking", *GRAMMAR_KINDS)

TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
STEP_BUCKETS = (0.001, 0.0025, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15,
                0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0)
STEP_KINDS = ("decode", "prefill", "mixed")
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
# queue time: vLLM's request_queue_time_seconds takes E2E_BUCKETS, whose first bound
# (0.3 s) put every queue time of a server keeping up in one bucket, which
# histogram_quantile reads as 0.15 s (p50) and 0.297 s (p99) however short the wait was
QUEUE_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0,
                 10.0, 20.0, 40.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
P = "fp8serve_"
# the API a request came through (the ``api`` label of the per-request outcome metrics);
# beam_search: the step requests of a beam search (service/beam_search.py), one per beam
# and token
APIS = ("completions", "chat", "messages", "responses", "beam_search")
# requests_rejected_total's reasons exported as zeros from the start: the engine's refusals
# (engine/request.py) and the service's usual statuses. A series born at its first
# refusal starts at 1, and rate() / increase() never see that step: a burst of refusals
# that starts a series reads 0 on the dashboard. A rarer reason still appears when it
# first happens.
REJECT_REASONS = (*(e.__name__ for e in (InvalidRequestError, QueueFullError,
                                        EngineUnavailableError)),
                  "http_400", "http_401", "http_404", "http_413")


class ServingMetrics(EngineObserver):
    """Request metrics (label ``model_name``) fed by the engine thread; the outcome of each
    request (success, abort, timeout, failure, end-to-end latency) also carries ``api``."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        self.model_name = model_name
        lbl = ["model_name"]

        def counter(name: str, doc: str, extra: tuple[str, ...] = ()) -> Counter:
            return Counter(P + name, doc, lbl + list(extra), registry=registry)

        def hist(name: str, doc: str, buckets: tuple[float, ...],
                 extra: tuple[str, ...] = ()) -> Histogram:
            return Histogram(P + name, doc, lbl + list(extra), buckets=buckets,
                             registry=registry)

        self.prompt_tokens = counter("prompt_tokens", "Prefilled prompt tokens.")
        self.generation_tokens = counter("generation_tokens", "Generated tokens.")
        self.success = counter("request_success", "Finished requests.",
                               ("api", "finished_reason"))
        self.rejected = counter("requests_rejected", "Requests refused at admission.",
                                ("reason",))
        self.aborted = counter("requests_aborted", "Requests aborted (client gone).", ("api",))
        self.timed_out = counter("requests_timed_out", "Requests past their deadline.",
                                 ("api",))
        self.failed = counter("requests_failed", "Requests ended by an engine error.",
                              ("api",))
        self.preemptions = counter("num_preemptions", "Running requests preempted (their "
                                   "KV freed, recomputed later).")
        self.cache_queries = counter("prefix_cache_queries", "Prompt tokens of admitted "
                                     "requests that looked up the prefix cache (a "
                                     "preempted request's re-admission not counted).")
        self.cache_hits = counter("prefix_cache_hits", "Of those, tokens found cached "
                                  "(their KV was not computed again).")
        # speculative decoding, vLLM's spec_decode_* meanings: drafts verified, the tokens
        # they proposed, those accepted (each by the ``grammar`` that constrained the
        # sequence: none, thinking, or engine.structured.spec.KINDS), and accepted ones by
        # draft position (0 = first)
        g = ("grammar",)
        self.spec_drafts = counter("spec_decode_num_drafts", "Speculative drafts verified.", g)
        self.spec_draft_tokens = counter("spec_decode_num_draft_tokens",
                                         "Draft tokens proposed and verified.", g)
        self.spec_accepted = counter("spec_decode_num_accepted_tokens",
                                     "Draft tokens accepted (equal to the target's token).", g)
        self._spec_children: dict[str, tuple[Any, Any, Any]] = {}
        self.spec_accepted_pos = counter("spec_decode_num_accepted_tokens_per_pos",
                                         "Accepted draft tokens by position in the draft.",
                                         ("position",))
        self._spec_pos_children: dict[int, Any] = {}
        # predicted outputs: draft tokens taken from requests' predictions, by outcome
        # (OpenAI's accepted_prediction_tokens / rejected_prediction_tokens, summed)
        self.prediction_tokens = counter("spec_decode_prediction_tokens",
                                         "Draft tokens taken from predicted outputs, by "
                                         "whether verification accepted them.", ("outcome",))
        self._prediction = {o: self.prediction_tokens.labels(model_name, o)
                            for o in ("accepted", "rejected")}
        self.ttft = hist("time_to_first_token_seconds", "Time to first token.", TTFT_BUCKETS)
        self.itl = hist("inter_token_latency_seconds", "Inter-token latency.", ITL_BUCKETS)
        self.e2e = hist("e2e_request_latency_seconds", "End-to-end latency.", E2E_BUCKETS,
                        ("api",))
        self.queue = hist("request_queue_time_seconds", "Time waiting before first "
                          "scheduled.", QUEUE_BUCKETS)
        # engine steps by kind: decode (one-token rows only), prefill (prompt tokens only),
        # mixed (both in one step: a prefill chunk stalls the decodes riding with it)
        self.step = Histogram(P + "engine_step_seconds", "Engine step wall time (forward, "
                              "sampling, outputs) by what the step carried.", lbl + ["kind"],
                              buckets=STEP_BUCKETS, registry=registry)
        self._steps = {k: self.step.labels(model_name, k) for k in STEP_KINDS}
        # children bound once (exported as zeros before the first request); the per-token
        # hooks then skip the label lookup
        (self._gen, self._itl, self._ttft, self._queue, self._prompt, self._cache_q,
         self._cache_h, self._preempt) = (m.labels(model_name) for m in (
             self.generation_tokens, self.itl, self.ttft, self.queue, self.prompt_tokens,
             self.cache_queries, self.cache_hits, self.preemptions))
        for grammar in SPEC_GRAMMARS:  # zeros before the first draft: rate() sees its step
            self._spec_grammar(grammar)
        self._export_outcomes()

    def _export_outcomes(self) -> None:
        """Each API's outcome series and the usual refusals' series, exported as zeros
        before the first request."""
        for reason in REJECT_REASONS:
            self.rejected.labels(self.model_name, reason)
        for api in APIS:
            for m in (self.aborted, self.timed_out, self.failed, self.e2e):
                m.labels(self.model_name, api)
            for reason in (FinishReason.STOP, FinishReason.LENGTH):
                self.success.labels(self.model_name, api, reason.value)

    def on_rejected(self, reason: str) -> None:
        self.rejected.labels(self.model_name, reason).inc()

    def on_admitted(self, queue_time: float, num_prompt_tokens: int) -> None:
        self._queue.observe(queue_time)
        self._prompt.inc(num_prompt_tokens)

    def on_preempted(self, num_requests: int) -> None:
        self._preempt.inc(num_requests)

    def on_prefix_cache(self, num_queried_tokens: int, num_hit_tokens: int) -> None:
        self._cache_q.inc(num_queried_tokens)
        self._cache_h.inc(num_hit_tokens)

    def on_first_token(self, ttft: float) -> None:
        self._ttft.observe(ttft)
        self._gen.inc()

    def on_token(self, inter_token_latency: float, num_tokens: int = 1) -> None:
        self._itl.observe(inter_token_latency)
        self._gen.inc(num_tokens)

    def on_spec_decode(self, num_draft_tokens: int, num_accepted_tokens: int,
                       grammar: str = "none") -> None:
        drafts, tokens, accepted = self._spec_grammar(grammar)
        drafts.inc()
        tokens.inc(num_draft_tokens)
        accepted.inc(num_accepted_tokens)
        for pos in range(num_accepted_tokens):
            self._spec_pos(pos).inc()

    def on_prediction(self, num_accepted: int, num_rejected: int) -> None:
        self._prediction["accepted"].inc(num_accepted)
        self._prediction["rejected"].inc(num_rejected)

    def _spec_grammar(self, grammar: str) -> tuple[Any, Any, Any]:
        """The spec_decode counters' children of one grammar kind (bound once)."""
        got = self._spec_children.get(grammar)
        if got is None:
            got = self._spec_children[grammar] = tuple(
                m.labels(self.model_name, grammar) for m in (
                    self.spec_drafts, self.spec_draft_tokens, self.spec_accepted))
        return got

    def _spec_pos(self, pos: int) -> Any:
        child = self._spec_pos_children.get(pos)
        if child is None:
            child = self._spec_pos_children[pos] = self.spec_accepted_pos.labels(
                self.model_name, str(pos))
        return child

    def on_step(self, seconds: float, num_decode_rows: int, num_prefill_tokens: int) -> None:
        kind = ("mixed" if num_decode_rows and num_prefill_tokens
                else "decode" if num_decode_rows else "prefill")
        self._steps[kind].observe(seconds)

    def on_finished(self, reason: FinishReason, e2e: float, num_output_tokens: int,
                    tag: str = "") -> None:
        """``tag``: the API label (service/generation.py API_OF_PREFIX)."""
        m = self.model_name
        if reason in (FinishReason.STOP, FinishReason.LENGTH):
            self.success.labels(m, tag, reason.value).inc()
            self.e2e.labels(m, tag).observe(e2e)
        elif reason is FinishReason.ABORT:
            self.aborted.labels(m, tag).inc()
        elif reason is FinishReason.TIMEOUT:
            self.timed_out.labels(m, tag).inc()
        else:
            self.failed.labels(m, tag).inc()


class EngineCollector(Collector):
    """Scrape-time gauges: engine queue state, kernel choices (service/kernel_metrics.py),
    hardware features."""

    def __init__(self, model_name: str, engine_stats: Callable[[], Any],
                 kernel_report: Callable[[], dict[str, Any]],
                 features: dict[str, bool]) -> None:
        self.model_name = model_name
        self.engine_stats = engine_stats
        self.kernel_report = kernel_report
        self.features = features

    def collect(self) -> Iterator[Metric]:
        yield from self._engine()
        yield from kernel_families(self.kernel_report())
        hw = GaugeMetricFamily(P + "hardware_feature", "Host feature present (1) or not (0).",
                               labels=["feature"])
        for name, present in sorted(self.features.items()):
            hw.add_metric([name], 1.0 if present else 0.0)
        yield hw

    def _engine(self) -> Iterator[Metric]:
        s = self.engine_stats()
        for name, doc, value in (
            ("num_requests_running", "Requests holding KV and running.", s.num_running),
            ("num_requests_waiting", "Requests queued or preempted.", s.num_waiting),
            ("kv_cache_usage_perc", "Fraction of KV blocks in use (0..1).", s.kv_cache_usage),
        ):
            g = GaugeMetricFamily(P + name, doc, labels=["model_name"])
            g.add_metric([self.model_name], float(value))
            yield g


class StoreCollector(Collector):
    """Scrape-time gauges of the in-memory stores (service/store/): ``stats()`` gives
    (name, help, value) triples."""

    def __init__(self, stats: Callable[[], list[tuple[str, str, float]]]) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        for name, doc, value in self.stats():
            g = GaugeMetricFamily(P + name, doc)
            g.add_metric([], float(value))
            yield g


def build_registry(model_name: str, engine_stats: Callable[[], Any],
                   kernel_report: Callable[[], dict[str, Any]], features: dict[str, bool],
                   extension: dict[str, str],
                   store_stats: Callable[[], list[tuple[str, str, float]]] | None = None
                   ) -> tuple[CollectorRegistry, ServingMetrics]:
    registry = CollectorRegistry()
    metrics = ServingMetrics(registry, model_name)
    registry.register(EngineCollector(model_name, engine_stats, kernel_report, features))
    if store_stats is not None:
        registry.register(StoreCollector(store_stats))
    Info(P + "extension", "Build of the C++ kernel extension.",
         registry=registry).info(extension)
    return registry, metrics
