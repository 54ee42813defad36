"""deploy/: the Kubernetes manifests, fp8serve.env and the Prometheus files parse, name
only real settings with valid values, point their probes and scrapes at real endpoints,
and give in-flight requests time to drain before SIGKILL. (Schemas, PromQL and the
rendered overlays: test_validate.py; sizing: test_k8s_sizing.py; metrics and rules:
test_monitoring.py.)"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from service.settings import Settings
from tests.deploy.shutdown import DEFAULT_DRAIN_S, stop_seconds

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
SETTING_NAMES = {f"FP8SERVE_{name.upper()}" for name in Settings.model_fields}


def _docs(path: Path) -> list[dict]:
    docs = [d for d in yaml.safe_load_all(path.read_text()) if d is not None]
    assert docs, f"{path} is empty"
    return docs


def _by_kind() -> dict[str, dict]:
    """The base objects and the HPA (deploy/k8s/base, deploy/k8s/autoscaling/hpa)."""
    out = {}
    for path in [*sorted((K8S / "base").glob("*.yaml")), K8S / "autoscaling/hpa/hpa.yaml"]:
        for doc in _docs(path):
            assert {"apiVersion", "kind"} <= doc.keys(), path
            out[doc["kind"]] = doc
    return out


@pytest.fixture(scope="module")
def k8s() -> dict[str, dict]:
    return _by_kind()


@pytest.fixture(scope="module")
def container(k8s) -> dict:
    (c,) = k8s["Deployment"]["spec"]["template"]["spec"]["containers"]
    return c


def _dotenv() -> dict[str, str]:
    env = {}
    for line in (DEPLOY / "fp8serve.env").read_text().splitlines():
        if line.lstrip().startswith("#"):
            continue  # commented-out names: _commented_names
        m = re.fullmatch(r"\s*(FP8SERVE_\w+)=(\S*)(\s+#.*)?", line)
        if m:
            env[m.group(1)] = m.group(2)
    return env


def _commented_names(path: Path) -> set[str]:
    return set(re.findall(r"#\s*(FP8SERVE_\w+)\s*[:=]", path.read_text()))


def _settings_from(env: dict[str, str], monkeypatch) -> Settings:
    for name in SETTING_NAMES:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return Settings()


def test_all_yaml_parses():
    files = [p for p in [*K8S.rglob("*.yaml"), *DEPLOY.rglob("*.yml")]
             if "node_modules" not in p.parts]
    assert len(files) >= 20
    for path in files:
        _docs(path)


def test_kustomization_lists_existing_files(k8s):
    for res in k8s["Kustomization"]["resources"]:
        assert (K8S / "base" / res).is_file(), res


def test_configmap_names_real_settings_with_valid_values(k8s, monkeypatch):
    data = k8s["ConfigMap"]["data"]
    assert set(data) <= SETTING_NAMES, set(data) - SETTING_NAMES
    assert _commented_names(K8S / "base/configmap.yaml") <= SETTING_NAMES
    s = _settings_from(data, monkeypatch)
    assert s.max_num_seqs == int(data["FP8SERVE_MAX_NUM_SEQS"])
    assert s.drain_timeout == float(data["FP8SERVE_DRAIN_TIMEOUT"])


def test_env_file_names_real_settings_with_valid_values(monkeypatch):
    """deploy/fp8serve.env: the compose file's env_file (every setting in it reaches the
    server), real settings with values the server takes."""
    env = _dotenv()
    assert {"FP8SERVE_HOST", "FP8SERVE_PORT"} <= set(env)
    assert set(env) <= SETTING_NAMES, set(env) - SETTING_NAMES
    assert {"FP8SERVE_MODEL", "FP8SERVE_THREADS"} <= _commented_names(DEPLOY / "fp8serve.env")
    assert _commented_names(DEPLOY / "fp8serve.env") <= SETTING_NAMES
    s = _settings_from(env, monkeypatch)
    assert s.port == int(env["FP8SERVE_PORT"])
    compose = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    service = compose["services"]["fp8serve"]
    assert service["env_file"] == ["fp8serve.env"]
    # what the compose environment sets wins over the file: the file must not name it
    # (an API key set there would be overridden by an empty one: no authentication)
    named = set(env) | _commented_names(DEPLOY / "fp8serve.env")
    assert not named & set(service["environment"]), named & set(service["environment"])
    assert "FP8SERVE_API_KEYS" in service["environment"]


def test_deployment_env_and_args_are_understood(container):
    for item in container.get("env", []):
        assert item["name"] in SETTING_NAMES, item["name"]
    from cli.main import build_parser

    args = build_parser().parse_args(container["args"])
    assert args.command == "serve"


def test_probes_hit_health_on_the_container_port(container, k8s):
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        get = container[probe]["httpGet"]
        assert get["path"] == "/health", probe
        assert get["port"] in ports or get["port"] in ports.values(), probe
    i = container["args"].index("--port")
    assert int(container["args"][i + 1]) in ports.values()
    (svc_port,) = k8s["Service"]["spec"]["ports"]
    assert svc_port["targetPort"] in ports
    annotations = k8s["Deployment"]["spec"]["template"]["metadata"]["annotations"]
    assert int(annotations["prometheus.io/port"]) in ports.values()
    assert annotations["prometheus.io/path"] == "/metrics"


def test_selectors_match_pod_labels(k8s):
    labels = k8s["Deployment"]["spec"]["template"]["metadata"]["labels"]
    for sel in (k8s["Deployment"]["spec"]["selector"]["matchLabels"],
                k8s["Service"]["spec"]["selector"]):
        assert sel.items() <= labels.items()
    target = k8s["HorizontalPodAutoscaler"]["spec"]["scaleTargetRef"]
    assert (target["kind"], target["name"]) == ("Deployment", k8s["Deployment"]["metadata"]["name"])


def test_grace_period_covers_prestop_sleep_plus_drain(k8s, container):
    spec = k8s["Deployment"]["spec"]["template"]["spec"]
    cmd = container["lifecycle"]["preStop"]["exec"]["command"]
    assert cmd[0] == "sleep"
    drain = k8s["ConfigMap"]["data"].get("FP8SERVE_DRAIN_TIMEOUT")
    drain_s = float(drain) if drain is not None else DEFAULT_DRAIN_S
    # the kubelet counts the preStop hook in the grace period; SIGTERM comes after it
    assert spec["terminationGracePeriodSeconds"] > float(cmd[1]) + stop_seconds(drain_s)


def test_every_deploy_path_the_docs_and_comments_name_exists():
    """A path under deploy/ named in deploy/'s own files, the README, docs/, the Makefile
    or the Dockerfile exists (a helm command once pointed at a values file that did
    not). deploy/.env is the operator's own, optional file."""
    files = [p for p in DEPLOY.rglob("*") if p.is_file() and "node_modules" not in p.parts
             and p.suffix in (".yml", ".yaml", ".md", ".sh", ".py", ".env", ".json", "")]
    files += [ROOT / "README.md", ROOT / "Makefile", ROOT / "Dockerfile",
              *(ROOT / "docs").glob("*.md")]
    missing = set()
    for f in files:
        for m in re.finditer(r"(?<![\w/.])deploy/[\w./{},*-]*[\w/]", f.read_text()):
            path = m.group(0).rstrip("/.")
            if not any(c in path for c in "{*,") and path != "deploy/.env" \
                    and not (ROOT / path).exists():
                missing.add(f"{f.relative_to(ROOT)}: {path}")
    assert not missing, sorted(missing)


def test_a_mounted_checkpoint_is_served_under_its_own_name(monkeypatch):
    """The checkpoint sits in /models/current, so the served name would be "current" (and a
    client naming the model a 404): each overlay that mounts one, and the compose file that
    does, set FP8SERVE_SERVED_MODEL_NAME to the model's name."""
    from tests.deploy.test_validate import V, require

    mounting = 0
    for overlay in V.OVERLAYS:
        objs = require(V.kustomize, overlay)
        (deploy,) = [o for o in objs if o["kind"] == "Deployment"]
        (cm,) = [o for o in objs if o["kind"] == "ConfigMap"]
        if not deploy["spec"]["template"]["spec"].get("volumes"):
            continue  # the demo overlay: the image's demo model, under its own name
        mounting += 1
        name = cm["data"].get("FP8SERVE_SERVED_MODEL_NAME", "")
        size = overlay.name.removeprefix("ministral-3-").upper()
        assert name.startswith(f"Ministral-3-{size}-"), (overlay.name, name)
        only = {"FP8SERVE_SERVED_MODEL_NAME": name}  # (threads: the pod's cores, not ours)
        assert _settings_from(only, monkeypatch).served_model_name == (name,)
    assert mounting >= 2
    compose = yaml.safe_load((DEPLOY / "docker-compose.model.yml").read_text())
    env = compose["services"]["fp8serve"]["environment"]
    assert env["FP8SERVE_MODEL"] == "/models/current"
    assert re.fullmatch(r"\$\{FP8SERVE_SERVED_MODEL_NAME:-Ministral-3-[\w-]+\}",
                        env["FP8SERVE_SERVED_MODEL_NAME"])


def test_replicas_share_the_thinking_signature_key(container):
    """Anthropic thinking blocks are signed with FP8SERVE_THINKING_SIGNATURE_KEY, else with
    a random key per process: a history signed by one replica was a 400 on another (the
    HPA's, the inference gateway's) and on every pod after a rollout. All pods take it
    from one Secret, which deploy/README.md says how to create."""
    env = {item["name"]: item for item in container.get("env", [])}
    ref = env["FP8SERVE_THINKING_SIGNATURE_KEY"]["valueFrom"]["secretKeyRef"]
    assert ref.get("optional") is True  # without it: one key per process, as before
    readme = (DEPLOY / "README.md").read_text()
    command = re.sub(r"\\\n\s*", "", readme)  # one line, continuations joined
    assert f"kubectl create secret generic {ref['name']} --from-literal={ref['key']}=" \
        in command


def test_a_disruption_budget_evicts_one_replica_at_a_time():
    """A node drain evicted every replica on it at once, and each needs minutes to load
    its model: the PodDisruptionBudget lets one go at a time. maxUnavailable, not
    minAvailable: with one replica minAvailable 1 would block a drain for good."""
    from tests.deploy.test_validate import V, require

    for overlay in V.OVERLAYS:
        objs = require(V.kustomize, overlay)
        (deploy,) = [o for o in objs if o["kind"] == "Deployment"]
        (pdb,) = [o for o in objs if o["kind"] == "PodDisruptionBudget"]
        labels = deploy["spec"]["template"]["metadata"]["labels"]
        assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items(), overlay.name
        assert pdb["spec"].get("maxUnavailable") == 1, overlay.name
        assert "minAvailable" not in pdb["spec"], overlay.name


def test_the_deployment_names_the_tag_make_image_builds(container):
    """Never `latest`: under IfNotPresent a node keeps whichever `latest` it pulled first.
    The base names the package version, the tag `make image` and the image scripts give."""
    version = re.search(r'^version = "(.+)"$', (ROOT / "pyproject.toml").read_text(),
                        re.M).group(1)
    assert container["image"] == f"fp8serve:{version}"
    made = subprocess.run(["make", "-s", "-n", "image"], cwd=ROOT, capture_output=True,
                          text=True, check=True).stdout
    assert f"-t fp8serve:{version} " in made
    for script in ("build-local.sh", "verify-image.sh"):
        text = (DEPLOY / "image" / script).read_text()
        assert "fp8serve:latest" not in text and "pyproject.toml" in text, script
