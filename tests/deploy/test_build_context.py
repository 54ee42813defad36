"""The build context the image is made from: .dockerignore keeps out local state but lets
through everything the Dockerfile copies, and a wheel built from exactly that context
carries the C++ sources that `fp8serve build-ext` compiles."""

from __future__ import annotations

import ast
import fnmatch
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.deploy.buildfiles import DockerIgnore, parse_dockerfile, read_toml

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "ext" / "csrc"


@pytest.fixture(scope="module")
def ignore() -> DockerIgnore:
    return DockerIgnore.from_text((ROOT / ".dockerignore").read_text())


def _copy_sources() -> list[str]:
    instrs = parse_dockerfile((ROOT / "Dockerfile").read_text())
    return [src for i in instrs if i.keyword == "COPY" and "from" not in i.flags
            for src in i.words()[:-1]]


def _tracked_files(top: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", top], cwd=ROOT, capture_output=True, text=True,
                         check=True).stdout.split()
    return [f for f in out if (ROOT / f).is_file()]


def _context_files(ignore: DockerIgnore) -> list[str]:
    """Every file under the COPY sources that the build context would carry."""
    files = []
    for src in _copy_sources():
        path = ROOT / src
        found = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
        files += [p.relative_to(ROOT).as_posix() for p in found]
    return [f for f in files if not ignore.excluded(f)]


def test_matcher_follows_docker_rules():
    ign = DockerIgnore.from_text("*\n!engine\n**/__pycache__\n*.md\n!README.md\ndocs/**/*.png")
    assert ign.excluded(".venv/bin/python") and ign.excluded("tests/test_x.py")
    assert not ign.excluded("engine/config.py")
    assert ign.excluded("engine/__pycache__/config.cpython-311.pyc")
    assert ign.excluded("NOTES.md") and not ign.excluded("README.md")
    assert ign.excluded("docs/a/b/x.png") and ign.excluded("docs/x.png")


def test_every_copy_source_is_in_the_context(ignore):
    sources = _copy_sources()
    assert {"pyproject.toml", "README.md", "engine", "ext", "cli", "service",
            "bench"} <= set(sources)
    for src in sources:
        assert not ignore.excluded(src), f"{src} is copied but excluded by .dockerignore"
        if (ROOT / src).is_dir():
            tracked = _tracked_files(src)
            assert tracked, f"no tracked files under {src}"
            dropped = [f for f in tracked if ignore.excluded(f)]
            assert not dropped, f".dockerignore drops tracked files: {dropped[:5]}"


def test_local_state_stays_out_of_the_context(ignore):
    for path in (".venv/bin/python", ".git/HEAD", "bench/results/kernels.json",
                 "tests/conftest.py", "engine/__pycache__/x.cpython-311.pyc",
                 "ext/build/fp8serve_ext.so", "ext/csrc/ops.o", "fp8serve.egg-info/PKG-INFO",
                 ".pytest_cache/v/cache", "models/ckpt/model.safetensors"):
        assert ignore.excluded(path), f"{path} would enter the build context"


def _ext_build_names() -> set[str]:
    """SOURCE_NAMES and HEADER_NAMES from ext/build.py (read, not imported)."""
    tree = ast.parse((ROOT / "ext" / "build.py").read_text())
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id in ("SOURCE_NAMES", "HEADER_NAMES")
                for t in node.targets):
            names |= set(ast.literal_eval(node.value))
    assert names, "ext/build.py no longer lists SOURCE_NAMES / HEADER_NAMES"
    return names


def test_package_data_covers_every_csrc_file():
    data = read_toml(ROOT / "pyproject.toml")
    patterns = data["tool"]["setuptools"]["package-data"]["ext"]
    assert {"csrc/*.cpp", "csrc/*.h", "csrc/*.inc"} <= set(patterns)
    names = {p.name for p in CSRC.iterdir() if p.is_file()}
    uncovered = [n for n in names if not any(fnmatch.fnmatch(f"csrc/{n}", p) for p in patterns)]
    assert not uncovered, f"not installed with the package: {uncovered}"
    missing = _ext_build_names() - names
    assert not missing, f"ext/build.py compiles files that do not exist: {missing}"


def test_wheel_built_from_the_context_carries_the_csrc_files(ignore, tmp_path):
    ctx = tmp_path / "ctx"
    for rel in _context_files(ignore):
        dst = ctx / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes((ROOT / rel).read_bytes())
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
                    "-q", "-w", str(tmp_path / "dist"), str(ctx)], check=True, env=env,
                   capture_output=True, timeout=300)
    (wheel,) = (tmp_path / "dist").glob("fp8serve-*.whl")
    in_wheel = {Path(n).name for n in zipfile.ZipFile(wheel).namelist()
                if n.startswith("ext/csrc/")}
    assert _ext_build_names() <= in_wheel
    assert {p.name for p in CSRC.iterdir() if p.is_file()} <= in_wheel
