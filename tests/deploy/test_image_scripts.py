"""deploy/image/*.sh: valid bash, and build-local.sh turns local pip sources into read-only
bind mounts plus build args the Dockerfile declares (run against a stand-in `podman` that
records its arguments; no image is built)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.deploy.buildfiles import arg_of, parse_dockerfile

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = sorted((ROOT / "deploy" / "image").glob("*.sh"))

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
