"""OpenAI's ``system_fingerprint``: which backend configuration produced an answer, so
that a client comparing answers (a ``seed`` that gave other tokens) can tell a changed
server from chance. It names what may change outputs: the fp8serve version, the model,
the host's CPU features and the extension's dispatch level, the kernel overrides, whether
rows run a kernel by their role and the lm_head dtype (they pick the kernels), the KV cache
dtype, the logprobs mode and speculative decoding; it stays the same across requests and
restarts of one setup."""

from __future__ import annotations

import hashlib
import json
from functools import lru_cache

from service.backend import ServingState


@lru_cache(maxsize=1)
def package_version() -> str:
    try:
        from importlib.metadata import version
        return version("fp8serve")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "0.0.0+local"


def system_fingerprint(state: ServingState) -> str:
    """``fp_`` and 12 hex digits of the configuration's hash."""
    cfg, backend = state.settings, state.backend
    parts = {"version": package_version(), "model": backend.model_name,
             "features": backend.hardware.feature_map(),
             "dispatch_isa": backend.hardware.dispatch_isa, "kernel": cfg.kernel,
             "disabled_kernels": sorted(cfg.disabled_kernels),
             "lm_head_dtype": cfg.lm_head_dtype,
             "kv_cache_dtype": cfg.kv_cache_dtype, "logprobs_mode": cfg.logprobs_mode,
             "speculative_config": cfg.speculative_config,
             "rows_by_role": bool(getattr(backend.runner, "rows_by_role", False))}
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()
    return f"fp_{digest[:12]}"
