"""README.md's commands run as written. Every ```bash block is preceded by a marker that
says how it is checked, so a new block fails here until someone decides:

- ``<!-- readme-test: run -->``: the block runs in the repository root (``fp8serve`` is the
  installed entry point, ``cli.main:main``) and must exit 0;
- ``<!-- readme-test: server [expect="TEXT"] -->``: the same against a demo-model server
  this test starts (``localhost:8000`` becomes its address); no answer may be an error,
  and the output must hold TEXT;
- ``<!-- readme-test: dry-run -->``: long or outside commands, checked without running:
  ``make T`` as ``make -n T``, ``fp8serve ...`` by its parser, ``kubectl apply -k DIR`` as
  ``kubectl kustomize DIR``, ``docker compose -f FILE`` by FILE being a compose file,
  ``hf download mistralai/NAME --local-dir DIR`` by its form, and ``NAME=$(...)`` (a
  variable set for the next commands) only when the rest of the block uses NAME.

Other shells' fences (sh, console, none) are refused: label them bash and mark them."""

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
MARKER = re.compile(r'<!-- readme-test: (?P<mode>[\w-]+)(?: expect="(?P<expect>[^"]*)")? -->')
FENCE = re.compile(r"^```(?P<lang>\S*)\n(?P<body>.*?)^```$", re.M | re.S)
SHELLS = {"", "sh", "shell", "console", "zsh", "bash"}
MODES = {"run", "server", "dry-run"}
HOSTS = re.compile(r"development (host|machine)|this (host|machine)|the current host", re.I)


def bash_blocks(text: str) -> list[tuple[str, str | None, str]]:
    """(mode, expected text, body) per shell block; ValueError for an unmarked one."""
    blocks = []
    for m in FENCE.finditer(text):
        if m.group("lang") not in SHELLS:
            continue
        line = text.count("\n", 0, m.start()) + 1
        if m.group("lang") != "bash":
            raise ValueError(f"README.md:{line}: label shell blocks ```bash")
        before = text[:m.start()].rstrip().rsplit("\n", 1)[-1]
        marker = MARKER.fullmatch(before.strip())
        if marker is None or marker["mode"] not in MODES:
            raise ValueError(f"README.md:{line}: a bash block needs a marker "
                             f"<!-- readme-test: {'|'.join(sorted(MODES))} --> before it")
        blocks.append((marker["mode"], marker["expect"], m.group("body")))
    return blocks


def commands(body: str) -> list[list[str]]:
    """The block's commands as argument lists (continuations joined, comments dropped)."""
    joined = body.replace("\\\n", " ")
    return [argv for line in joined.splitlines() if (argv := shlex.split(line, comments=True))]


BLOCKS = bash_blocks(README.read_text(encoding="utf-8"))


def _ids(mode: str) -> list:
    return [pytest.param(b, id=f"block{i}") for i, b in enumerate(BLOCKS) if b[0] == mode]


@pytest.fixture(scope="module")
def shell_env(tmp_path_factory) -> dict[str, str]:
    """PATH with `fp8serve` (the installed entry point, run from this checkout) in front,
    and nothing else changed: another ninja on the PATH would rebuild the extension."""
    bin_dir = tmp_path_factory.mktemp("bin")
    shim = bin_dir / "fp8serve"
    shim.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m cli.main "$@"\n')
    shim.chmod(0o755)
    path = os.pathsep.join([str(bin_dir), os.environ.get("PATH", "")])
    return {**os.environ, "PATH": path, "PYTHONPATH": str(ROOT)}


def run_block(body: str, env: dict[str, str]) -> str:
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", body], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, f"{body}\nexit {proc.returncode}:\n{proc.stderr[-3000:]}"
    return proc.stdout


def test_every_shell_block_has_a_mode_and_the_readme_stays_short():
    assert {mode for mode, _, _ in BLOCKS} == MODES
    text = README.read_text(encoding="utf-8")
    assert text.count("\n") <= 350
    assert not HOSTS.search(text), HOSTS.search(text).group(0)


def test_an_unmarked_or_unlabelled_block_is_refused():
    with pytest.raises(ValueError, match="needs a marker"):
        bash_blocks("text\n\n```bash\nmake serve\n```\n")
    with pytest.raises(ValueError, match="label shell blocks"):
        bash_blocks("<!-- readme-test: run -->\n```sh\nls\n```\n")
    assert bash_blocks('<!-- readme-test: server expect="x" -->\n```bash\nls\n```\n') == [
        ("server", "x", "ls\n")]


@pytest.mark.slow
@pytest.mark.parametrize("block", _ids("run"))
def test_run_blocks_succeed(block, shell_env):
    assert run_block(block[2], shell_env).strip()


@pytest.fixture(scope="module")
def demo_server():
    from engine.demo_model import ensure_demo_model
    from tests.service.serve_process import start_server, stop_server

    server = start_server(ensure_demo_model(), "--kv-cache-gib", "0.25")
    yield server
    stop_server(server)


@pytest.mark.slow
@pytest.mark.parametrize("block", _ids("server"))
def test_server_blocks_answer(block, shell_env, demo_server):
    _, expect, body = block
    address = demo_server["url"].removeprefix("http://")
    body = re.sub(r"\b(localhost|127\.0\.0\.1):8000\b", address, body)
    out = run_block(body, shell_env)
    assert out.strip() and '"error"' not in out, out
    assert expect is None or expect in out, out


def dry_run(argv: list[str], env: dict[str, str]) -> None:
    tool, args = argv[0], argv[1:]
    if tool == "hf":
        assert args[:1] == ["download"] and re.fullmatch(r"mistralai/[\w.-]+", args[1]), argv
        assert "--local-dir" in args, argv
        return
    if tool == "make":
        check = ["make", "-n", *args]
    elif tool == "fp8serve":
        from cli.main import build_parser

        build_parser().parse_args(args)  # SystemExit on an unknown flag or a bad value
        return
    elif argv[:3] == ["kubectl", "apply", "-k"]:
        kubectl = shutil.which("kubectl", path=os.pathsep.join(
            [str(Path(sys.executable).parent), env["PATH"]]))
        assert kubectl, "kubectl not found (make setup installs it)"
        check = [kubectl, "kustomize", argv[3]]
    elif argv[:2] == ["docker", "compose"]:
        files = [args[i + 2] for i, a in enumerate(args[1:]) if a == "-f"]
        assert files and all("services" in yaml.safe_load((ROOT / f).read_text())
                             for f in files), argv
        return
    else:
        raise AssertionError(f"no dry-run check for {shlex.join(argv)}: add one here")
    proc = subprocess.run(check, cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, f"{shlex.join(check)}:\n{proc.stderr[-2000:]}"


@pytest.mark.parametrize("block", _ids("dry-run"))
def test_dry_run_blocks_would_run(block, shell_env):
    body = block[2]
    for name in re.findall(r"^(\w+)=\$\(", body, re.M):  # NAME=$(...): used further on
        assert f'"${name}"' in body, f"{name} is set and never used"
    body = re.sub(r"^\w+=\$\(.*\)[^\n]*\n", "", body, flags=re.M)
    argvs = commands(body)
    assert argvs
    for argv in argvs:
        dry_run(argv, shell_env)


def test_the_checkpoints_doc_commands_parse(shell_env):
    """docs/checkpoints.md's commands (the model card's vLLM command as fp8serve runs it)
    are checked as the README's dry-run blocks are."""
    text = (ROOT / "docs" / "checkpoints.md").read_text(encoding="utf-8")
    bodies = [m.group("body") for m in FENCE.finditer(text) if m.group("lang") == "bash"]
    assert bodies
    for body in bodies:
        for argv in commands(body):
            dry_run(argv, shell_env)
