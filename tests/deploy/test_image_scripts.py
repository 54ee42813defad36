"""deploy/image/*.sh: valid bash, and build-local.sh turns local pip sources into read-only
bind mounts plus build args the Dockerfile declares (run against a stand-in `podman` that
records its arguments; no image is built)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.deploy.buildfiles import arg_of, parse_dockerfile

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = [*sorted((ROOT / "deploy" / "image").glob("*.sh")), ROOT / "deploy" / "verify.sh"]

FAKE_PODMAN = """#!/bin/sh
printf '%s\\n' "$@" > "$PODMAN_LOG.$1"
"""


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_script_is_valid_bash_and_executable(script):
    subprocess.run(["bash", "-n", str(script)], check=True)
    assert os.access(script, os.X_OK), f"{script.name} is not executable"


def _run_build_local(tmp_path: Path, **env: str) -> list[str]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "podman").write_text(FAKE_PODMAN)
    (bin_dir / "podman").chmod(0o755)
    log = tmp_path / "podman"
    full_env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}",
                "PODMAN_LOG": str(log), **env}
    subprocess.run([str(ROOT / "deploy/image/build-local.sh"), "--no-cache"], check=True,
                   env=full_env, capture_output=True, timeout=60)
    assert (log.with_name("podman.image")).exists(), "base image presence was not checked"
    return (log.with_name("podman.build")).read_text().splitlines()


def _pairs(argv: list[str], flag: str) -> list[str]:
    return [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == flag]


def test_build_local_mounts_local_pip_sources_and_passes_them(tmp_path):
    wheels, index, ca = tmp_path / "wheels", tmp_path / "pypi" / "simple", tmp_path / "ca.crt"
    wheels.mkdir()
    index.mkdir(parents=True)
    ca.write_text("cert")
    argv = _run_build_local(tmp_path, FIND_LINKS=str(wheels), INDEX_URL="",
                            EXTRA_INDEX_URL=f"file://{index} https://mirror.example/simple",
                            CA_BUNDLE=str(ca), IMAGE="fp8serve:test", BASE_IMAGE="base:x")
    assert {"--isolation", "chroot", "--format", "docker", "--no-cache"} <= set(argv)
    assert _pairs(argv, "--format") == ["docker"]  # the OCI format would drop HEALTHCHECK
    mounts = _pairs(argv, "-v")
    assert f"{wheels}:{wheels}:ro" in mounts
    assert f"{index.parent}:{index.parent}:ro" in mounts  # index pages link to ../files
    assert f"{ca}:/etc/fp8serve-build-ca.crt:ro" in mounts
    assert not any("mirror.example" in m for m in mounts)
    build_args = dict(a.split("=", 1) for a in _pairs(argv, "--build-arg"))
    assert build_args["PYTHON_IMAGE"] == "base:x"
    assert build_args["TORCH_INDEX_URL"] == ""
    assert build_args["PIP_FIND_LINKS"] == str(wheels)
    assert build_args["PIP_EXTRA_INDEX_URL"] == f"file://{index} https://mirror.example/simple"
    assert build_args["PIP_CERT"] == "/etc/fp8serve-build-ca.crt"
    assert "PIP_INDEX_URL" not in build_args
    assert _pairs(argv, "-t") == ["fp8serve:test"] and argv[-1] == str(ROOT)

    declared = {arg_of(i)[0] for i in parse_dockerfile((ROOT / "Dockerfile").read_text())
                if i.keyword == "ARG"}
    assert set(build_args) <= declared, set(build_args) - declared


def _stub_tree(tmp_path: Path, fail: str = "") -> Path:
    """deploy/verify.sh beside stand-ins for its scripts that log their calls."""
    tree = tmp_path / "deploy"
    (tree / "image").mkdir(parents=True)
    shutil.copy(ROOT / "deploy/verify.sh", tree / "verify.sh")
    log = tmp_path / "calls"
    for name in ("image/build-base.sh", "image/build-local.sh", "image/verify-image.sh",
                 "validate.py"):
        code = 1 if name == fail else 0
        (tree / name).write_text(f'#!/bin/sh\necho "{name} $* ISA=$ISA '
                                 f'EXPECT=$EXPECT_KERNEL IMAGE=$IMAGE" >> {log}\nexit {code}\n')
        (tree / name).chmod(0o755)
    return tree


@pytest.mark.skipif(os.getuid() != 0, reason="verify.sh refuses to run without root")
def test_verify_runs_the_four_steps_in_order_and_summarises(tmp_path):
    tree = _stub_tree(tmp_path)
    env = {**os.environ, "PYTHON": "sh", "IMAGE": "img:t", "BASE_IMAGE": "base:t"}
    out = subprocess.run([str(tree / "verify.sh")], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["image/build-base.sh", "image/build-local.sh",
                                             "image/verify-image.sh", "image/verify-image.sh",
                                             "validate.py"]
    assert calls[0].startswith("image/build-base.sh base:t")
    assert "ISA= EXPECT= IMAGE=img:t" in calls[2]
    assert "ISA=avx2 EXPECT=avx2_w8a16" in calls[3]
    assert out.stdout.count("\nok   ") == 5 and "in all)" in out.stdout


@pytest.mark.skipif(os.getuid() != 0, reason="verify.sh refuses to run without root")
def test_verify_stops_building_after_a_failed_build_but_still_validates(tmp_path):
    tree = _stub_tree(tmp_path, fail="image/build-local.sh")
    out = subprocess.run([str(tree / "verify.sh")], env={**os.environ, "PYTHON": "sh"},
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    calls = [c.split()[0] for c in (tmp_path / "calls").read_text().splitlines()]
    assert calls == ["image/build-base.sh", "image/build-local.sh", "validate.py"]
    assert "FAIL 2. image" in out.stdout


def _kernels_check(kernels: dict, expect: str, tmp_path: Path) -> int:
    """verify-image.sh's /kernels check (its inline Python) on a /kernels body."""
    text = (ROOT / "deploy/image/verify-image.sh").read_text()
    code = text.split('native kernel}" python3 -c \'', 1)[1].split("\n' ", 1)[0]
    body = tmp_path / "kernels.json"
    body.write_text(json.dumps(kernels))
    return subprocess.run([sys.executable, "-c", code, str(body), expect],
                          capture_output=True, timeout=60).returncode


@pytest.mark.parametrize(("layers", "expect", "rc"), [
    # the demo: FP8 layers on the expected kernel, its bf16 head on a bf16 kernel
    ([("avx2_w8a16", "per_channel")] * 3 + [("bf16_avx2", "bf16")], "avx2_w8a16", 0),
    ([("avx2_w8a16", "per_channel"), ("torch_w8a16", "per_channel")], "avx2_w8a16", 1),
    ([("avx512_w8a16", "per_tensor"), ("torch_mm", "bf16")], "", 0),
    ([("avx512_w8a16", "per_tensor"), ("torch_w8a16", "per_tensor")], "", 1),
    ([("bf16_avx2", "bf16")], "", 1),  # no FP8 layer at all
])
def test_the_image_checks_kernel_check_reads_fp8_layers_only(tmp_path, layers, expect, rc):
    kernels = {"hardware": {"dispatch_isa": "avx2"},
               "layers": [{"layer": f"l{i}", "kernel_id": k, "scale_kind": s}
                          for i, (k, s) in enumerate(layers)]}
    assert _kernels_check(kernels, expect, tmp_path) == rc
