"""Shared pytest fixtures.

``tiny_checkpoint`` writes small random-weight checkpoints with engine.synth (milliseconds
each) and caches them for the session::

    def test_something(tiny_checkpoint):
        model_dir = tiny_checkpoint()                          # hf-text, FP8 per-tensor
        native = tiny_checkpoint(layout="native", seed=3)
        mm = tiny_checkpoint(layout="hf-multimodal", tie_word_embeddings=True)
        block = tiny_checkpoint(quant="fp8-block", shard_bytes=200_000)

Keyword arguments override fields of ``SynthSpec.preset("tiny")`` (see engine/synth/spec.py:
hidden 256, intermediate 512, 2 layers, 4 heads / 2 KV heads, head_dim 64, vocab 1024,
YaRN with original_max_position_embeddings 32, llama_4_scaling_beta 0.1, no tekken.json).
Pass ``shape="ministral-3-3b"`` etc. to start from another preset. The directories are
shared between tests: treat them as read-only, and copy one (``shutil.copytree``) before
corrupting it. The same seed gives identical weights in every layout."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    from engine.synth import SynthSpec, write_checkpoint

    cache: dict[tuple, Path] = {}

    def make(shape: str = "tiny", **overrides: object) -> Path:
        key = (shape, tuple(sorted(overrides.items(), key=lambda kv: kv[0])))
        if key not in cache:
            spec = SynthSpec.preset(shape, **overrides)
            out = tmp_path_factory.mktemp(f"ckpt-{spec.layout}-{spec.quant}")
            write_checkpoint(out, spec)
            cache[key] = out
        return cache[key]

    return make


# Session fixtures that start servers for several files: under pytest-xdist (`make test`
# runs two workers, --dist loadgroup) the files that use one run on one worker, so each
# server starts once; every other file is its own group, so its module fixtures start once.
SHARED_SERVERS = ("matrix", "spec_servers")


# before pytest-xdist's own hook, which reads the xdist_group marks into the node ids
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        # schemathesis names each operation's item (test_contract[POST /v1/...]) but gives
        # all of them the function's node id; xdist schedules by node id, so it would run
        # one operation of the 13
        if not item.nodeid.endswith("]") and item.name != item.name.split("[", 1)[0]:
            if hasattr(item.parent, "id"):  # pytest 9: a structured NodeId
                item._id = item.parent.id.child(item.name)
            else:
                item._nodeid = f"{item.nodeid.rsplit('::', 1)[0]}::{item.name}"
    files: dict[str, str] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        shared = next((f for f in SHARED_SERVERS if f in item.fixturenames), None)
        if shared is not None or path not in files:
            files[path] = shared or files.get(path, path)
    for item in items:
        item.add_marker(pytest.mark.xdist_group(files[item.nodeid.split("::", 1)[0]]))
    # the long groups first (shared servers, end-to-end files, benchmarks, slow-marked
    # ones): the workers take groups in this order, so none ends the run on one worker
    slow = {files[i.nodeid.split("::", 1)[0]] for i in items if i.get_closest_marker("slow")}

    def long(group: str) -> bool:
        return (group in slow or group in SHARED_SERVERS or "/test_e2e_" in group
                or group.startswith("tests/bench/"))
    items.sort(key=lambda i: not long(files[i.nodeid.split("::", 1)[0]]))


def pytest_xdist_node_collection_finished(node, ids) -> None:
    """Stop a run that lost the groups above (each shared server would start once per
    worker, and the suite outgrow its time): pytest-xdist writes a test's group into its
    node id, which pytest 9.2 ignores (pytest-dev/pytest-xdist#1386; pyproject pins below
    it). Called on the controller with each worker's collection."""
    if node.config.getvalue("dist") != "loadgroup":
        return
    lost = [nodeid for nodeid in ids if nodeid.rfind("@") <= nodeid.rfind("]")]  # as xdist
    if lost:
        pytest.exit(f"--dist loadgroup lost the xdist_group of {len(lost)} of {len(ids)} "
                    f"tests (first: {lost[0]}): pytest {pytest.__version__} with this "
                    "pytest-xdist does not group them", returncode=4)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    from tests.skip_report import terminal_summary

    terminal_summary(terminalreporter, config)
