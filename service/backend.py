"""The loaded model as the service sees it, and the state the lifespan owns.

:class:`ModelBackend` is what a loader returns (runner, tokenizer, name, hardware); tests
inject fakes through ``create_app(load_backend=...)``. :class:`ServingState` wires the
backend to an :class:`engine.engine.Engine` and a per-app metrics registry.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
import time
from collections.abc import Callable
from contextvars import ContextVar
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry

from engine.checkpoint.errors import CheckpointError
from engine.checkpoint.generation import (
    GENERATION_CONFIG,
    SamplingDefaults,
    defaults_from,
    sampling_defaults,
)
from engine.config import EngineConfig
from engine.engine import Engine
from engine.hardware import HardwareInfo
from engine.kernels.layer_kernel import KernelReport
from engine.kernels.registry import KernelOverrides, overrides_from
from engine.spec.config import SpeculativeConfig
from engine.stream import LoopDispatcher
from service.metrics import ServingMetrics, build_registry
from service.settings import Settings
from service.store.conversations import ConversationStore
from service.store.jobs import BackgroundJobs
from service.store.responses import ResponseStore
from service.tool_calls.select import ParserChoice, choose_parsers
from service.translate.sealed import ReasoningSeal
from service.translate.signature import ThinkingSigner

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ModelBackend:
    runner: Any  # ModelRunner: .run(BatchInputs), .num_kv_blocks, .block_size, .kernel_report
    tokenizer: Any  # engine.text.tokenizer.Tokenizer
    model_name: str
    hardware: HardwareInfo
    engine_config: EngineConfig
    detokenizer: Callable[..., Any] | None = None  # None = IncrementalDetokenizer
    overrides: KernelOverrides | None = None  # operator kernel overrides in effect
    # defaults for sampling fields a request leaves out (generation_config.json)
    sampling_defaults: SamplingDefaults = SamplingDefaults()
    vision: Any = None  # engine.vision.runtime.VisionRuntime when images are served
    vision_off_reason: str | None = None  # why not, for the 400 and /kernels

    @property
    def grammar_compiler(self) -> Any:
        """engine.structured.GrammarCompiler for this tokenizer, built on first use and
        shared (its cache too); call ``.compile(spec)`` from a thread pool."""
        from engine.structured import compiler_for

        return compiler_for(self.tokenizer)


def generation_defaults(settings: Settings, model_dir: Path) -> SamplingDefaults:
    """The sampling defaults: --generation-config's (the checkpoint's
    generation_config.json, another directory's, or none), then
    --override-generation-config's keys set over them (vLLM's)."""
    mode = settings.generation_config
    defaults = SamplingDefaults()
    if mode not in ("none", "vllm"):
        defaults = sampling_defaults(model_dir if mode == "auto" else Path(mode))
    if settings.override_generation_config is not None:
        defaults = defaults_from(json.loads(settings.override_generation_config),
                                 "--override-generation-config", defaults)
    return defaults


def check_quantization(settings: Settings, model_dir: Path) -> None:
    """vLLM's --quantization fp8 names what is served: an FP8 checkpoint (read from its
    config files, before any weight is loaded); a bf16 one is a CheckpointError."""
    from engine.loader import read_model_config

    if settings.quantization != "fp8":
        return
    if read_model_config(model_dir, settings.checkpoint_layout).quant.method != "fp8":
        raise CheckpointError(f"--quantization fp8: {model_dir} holds bf16 weights (no FP8 "
                              "quantization_config); this server does not quantize at load: "
                              "serve an FP8 checkpoint, or leave the flag out")


def default_max_model_len(settings: Settings) -> int:
    """settings.max_model_len, or the checkpoint's max_position_embeddings when that is
    smaller and the value is the default (no flag, no environment variable). The demo
    model (settings.model None) holds 8192 positions, above the default."""
    if "max_model_len" in settings.model_fields_set or settings.model is None:
        return settings.max_model_len
    from engine.loader import read_model_config

    limit = read_model_config(settings.model, settings.checkpoint_layout).max_position_embeddings
    return min(settings.max_model_len, limit)


def load_backend(settings: Settings) -> ModelBackend:
    """Load the checkpoint named by ``settings`` (the demo model when None)."""
    from engine.runner import load_runner
    from engine.text.chat_template import template_from_flag
    from engine.text.tokenizer import Tokenizer

    model_dir = settings.model
    if model_dir is None:
        from engine.demo_model import ensure_demo_model
        model_dir = ensure_demo_model()
    cfg = EngineConfig(model_dir=model_dir, max_num_seqs=settings.max_num_seqs,
                       max_model_len=settings.max_model_len,
                       kv_cache_gib=settings.kv_cache_gib,
                       max_num_batched_tokens=settings.max_num_batched_tokens,
                       max_prefill_tokens_with_decodes=settings.max_prefill_tokens_with_decodes,
                       threads=settings.threads, heap_retain_mib=settings.heap_retain_mib,
                       enable_prefix_caching=settings.enable_prefix_caching,
                       scheduling_policy=settings.scheduling_policy,
                       kernel=settings.kernel,
                       disabled_kernels=tuple(settings.disabled_kernels),
                       lm_head_dtype=settings.lm_head_dtype,
                       kv_cache_dtype=settings.kv_cache_dtype,
                       speculative_config=SpeculativeConfig.parse(settings.speculative_config),
                       seed=settings.seed, logprobs_mode=settings.logprobs_mode,
                       rows_by_role=settings.rows_by_role)
    from engine.hardware_probe import probe_hardware

    hw = probe_hardware()
    overrides = overrides_from(settings.kernel, settings.disabled_kernels)
    check_quantization(settings, model_dir)
    runner = load_runner(model_dir, cfg, hw=hw, overrides=overrides,
                         layout=settings.checkpoint_layout)
    name = (settings.served_model_name or (model_dir.resolve().name,))[0]
    defaults = generation_defaults(settings, model_dir)
    if defaults.as_dict():
        log.info("sampling defaults: %s (requests override them; --generation-config "
                 "none ignores %s)", defaults.as_dict(), GENERATION_CONFIG)
    template = (None if settings.chat_template is None
                else template_from_flag(settings.chat_template))
    tokenizer = Tokenizer.from_dir(model_dir, settings.tokenizer_mode, template,
                                   settings.chat_template_content_format)
    tokenizer.check_fits(runner.config.vocab_size)
    _ = tokenizer.max_token_bytes  # the prompt-length bound, read once here, not by a request
    from service.vision_setup import load_vision_runtime

    vision, why = load_vision_runtime(model_dir, settings, tokenizer)
    return ModelBackend(runner, tokenizer, name, hw, cfg, overrides=runner.overrides,
                        sampling_defaults=defaults, vision=vision, vision_off_reason=why)


# True inside an HTTP request the server took before a drain began (the InFlight
# middleware sets it): its engine requests, a beam search's later steps among them, are
# taken while the engine drains, as in-flight requests get --drain-timeout; a request
# that arrives during the drain is refused (503).
ADMITTED_BEFORE_DRAIN: ContextVar[bool] = ContextVar("fp8serve_admitted_before_drain",
                                                     default=False)


class ServingState:
    """Everything the routes need; built in the lifespan (health "loading" until then)."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.health = "loading"  # loading | ready | draining (engine death: see status)
        self.backend: ModelBackend | None = None
        self.engine: Engine | None = None
        self.registry: CollectorRegistry | None = None
        self.metrics: ServingMetrics | None = None
        self.dispatcher: LoopDispatcher | None = None  # engine thread -> event loop
        self.started = time.time()
        # HTTP requests being answered (service/app.py InFlight): the drain waits for
        # those still before the engine too (fetching an image, tokenizing)
        self.http_in_flight = 0
        self.parsers: ParserChoice = ParserChoice(None, None, "")  # set by attach
        key = settings.thinking_signature_key
        secret = key.get_secret_value().encode() if key else secrets.token_bytes(32)
        self.signer = ThinkingSigner(secret)
        self.sealer = ReasoningSeal(secret)  # Responses reasoning items' encrypted_content
        mib = settings.responses_store_mib
        self.responses: ResponseStore | None = ResponseStore(mib * 2**20) if mib else None
        # stored chat completions (store: true), a store of their own with the same budget
        self.chat_completions = ResponseStore(mib * 2**20) if mib else None
        self.jobs = BackgroundJobs()  # running background responses
        mib = settings.conversations_store_mib
        self.conversations = ConversationStore(mib * 2**20) if mib else None

    def attach(self, backend: ModelBackend) -> None:
        """Start serving ``backend``; called on the event loop (the lifespan)."""
        self.backend = backend
        self.parsers = choose_parsers(backend.tokenizer, self.settings.tool_call_parser,
                                      self.settings.reasoning_parser)
        log.info("chat output parsers: %s", self.parsers.why)
        self.dispatcher = LoopDispatcher(asyncio.get_running_loop())
        self.registry, self.metrics = build_registry(
            backend.model_name, lambda: self.engine.stats(), self.kernel_snapshot,
            backend.hardware.feature_map(), _extension_info(backend.hardware),
            self.store_stats)
        self.engine = Engine(backend.runner, backend.tokenizer, backend.engine_config,
                             max_queue=self.settings.max_queue, observer=self.metrics,
                             detokenizer=backend.detokenizer)
        self.engine.start()
        self.health = "ready"
        vision = getattr(backend, "vision", None)
        if vision is not None:
            from service.vision_metrics import VisionMetrics

            vision.observer = VisionMetrics(self.registry, backend.model_name)
        log.info("image input: %s", vision.describe() if vision is not None else
                 f"off ({getattr(backend, 'vision_off_reason', None) or 'no vision tower'})")

    def store_stats(self) -> list[tuple[str, str, float]]:
        """The in-memory stores' gauges (/metrics): entries, bytes and budgets (a store
        that is off reads 0), and background responses running."""
        out: list[tuple[str, str, float]] = []
        for name, what, store in (("responses_store", "stored responses",
                                   self.responses),
                                  ("conversations_store", "conversations",
                                   self.conversations)):
            on = store is not None  # an empty store is falsy (len 0)
            out += [(f"{name}_entries", f"{what.capitalize()} kept.",
                     len(store) if on else 0),
                    (f"{name}_bytes", f"JSON bytes the {what} hold (their budget counts "
                     "these).", store.used if on else 0),
                    (f"{name}_budget_bytes", f"The {what}' byte budget (0: off).",
                     store.budget if on else 0)]
        out.append(("background_responses_running", "Background responses running.",
                    len(self.jobs)))
        return out

    @property
    def status(self) -> str:
        if self.engine is not None and self.engine.stats().state == "dead":
            return "dead"
        return self.health

    def kernel_snapshot(self) -> dict[str, Any]:
        report = getattr(self.backend.runner, "kernel_report", None) if self.backend else None
        if report is None:
            return {"layers": [], "runtime_fallbacks": [], "decoder_layers": []}
        return report.snapshot()

    def kernels_body(self) -> dict[str, Any]:
        """GET /kernels: engine.kernels.report's full report for a real runner."""
        hw = self.backend.hardware
        report = getattr(self.backend.runner, "kernel_report", None)
        if isinstance(report, KernelReport):
            from engine.kernels.report import build_kernel_report
            return {**build_kernel_report(hw, self.backend.overrides, report),
                    "vision": self.vision_body()}
        return {"hardware": {"machine": hw.machine, "cpu_model": hw.cpu_model,
                             "num_cpus": hw.num_cpus, "features": hw.feature_map()},
                "extension": asdict(hw.extension), **self.kernel_snapshot()}

    def vision_body(self) -> dict[str, Any]:
        """Whether images are served, and how (the ``vision`` part of /kernels)."""
        vision = getattr(self.backend, "vision", None)
        if vision is None:
            why = getattr(self.backend, "vision_off_reason", None) or "no vision tower"
            return {"images": False, "reason": why}
        return vision.describe()

    def begin_drain(self) -> None:
        if self.health == "ready":
            self.health = "draining"
        if self.engine is not None:
            self.engine.begin_drain()

    def wait_drained(self, timeout: float, poll: float = 0.05) -> bool:
        """Block until no request is in flight (in the engine, background responses
        among them, or still being answered over HTTP) or ``timeout`` passes; True if
        drained."""
        end = time.monotonic() + timeout
        while self.http_in_flight > 0 or (self.engine is not None
                                          and self.engine.num_unfinished > 0):
            if time.monotonic() >= end:
                return False
            time.sleep(poll)
        return True

    def close(self) -> None:
        """Stop serving: running background responses end cancelled, then the engine
        stops. Called on the event loop (the lifespan)."""
        self.jobs.cancel_all()
        if self.engine is not None:
            self.engine.shutdown()


def _extension_info(hw: HardwareInfo) -> dict[str, str]:
    ext = hw.extension
    return {"built": str(ext.built).lower(), "path": ext.path or "",
            "compiler": ext.compiler or "", "torch_version": ext.torch_version or "",
            "error": (ext.error or "")[:200]}
