"""deploy/k8s/inference-gateway: the InferencePool selects the base Deployment's pods on
their serving port, the EPP serves that pool with the config the ConfigMap holds, the
HTTPRoute sends to the pool, and the EndpointPickerConfig only references plugins it
defines, with a prefix block size equal to the engine's KV block. (Schemas: the crds check
of test_validate.py; metric names: test_monitoring.py.)"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from engine.config import EngineConfig

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy/k8s"
GATEWAY = K8S / "inference-gateway"


def _objects(directory: Path) -> dict[tuple[str, str], dict]:
    names = yaml.safe_load((directory / "kustomization.yaml").read_text())["resources"]
    out = {}
    for name in names:
        for doc in yaml.safe_load_all((directory / name).read_text()):
            out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


@pytest.fixture(scope="module")
def objs() -> dict[tuple[str, str], dict]:
    return _objects(GATEWAY)


@pytest.fixture(scope="module")
def base() -> dict[tuple[str, str], dict]:
    return _objects(K8S / "base")


@pytest.fixture(scope="module")
def epp_container(objs) -> dict:
    (c,) = objs[("Deployment", "fp8serve-epp")]["spec"]["template"]["spec"]["containers"]
    return c


def epp_config(objs) -> dict:
    return yaml.safe_load(objs[("ConfigMap", "fp8serve-epp")]["data"]["epp-config.yaml"])


def _flag(container: dict, name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in container["args"] if a.startswith(f"--{name}=")]
    return value


def test_pool_selects_the_fp8serve_pods_on_their_serving_port(objs, base):
    pool = objs[("InferencePool", "fp8serve")]["spec"]
    pod = base[("Deployment", "fp8serve")]["spec"]["template"]
    assert pool["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
    (container,) = pod["spec"]["containers"]
    assert [p["number"] for p in pool["targetPorts"]] == \
        [p["containerPort"] for p in container["ports"] if p["name"] == "http"]


def test_pool_points_at_the_epp_service_and_the_epp_at_the_pool(objs, epp_container):
    ref = objs[("InferencePool", "fp8serve")]["spec"]["endpointPickerRef"]
    svc = objs[("Service", ref["name"])]["spec"]
    (port,) = [p for p in svc["ports"] if p["port"] == ref["port"]["number"]]
    assert port["targetPort"] in {p["name"] for p in epp_container["ports"]}
    epp = objs[("Deployment", "fp8serve-epp")]["spec"]
    assert svc["selector"].items() <= epp["template"]["metadata"]["labels"].items()
    assert _flag(epp_container, "pool-name") == "fp8serve"


def test_epp_reads_the_configmap_it_mounts(objs, epp_container):
    path = Path(_flag(epp_container, "config-file"))
    (mount,) = [m for m in epp_container["volumeMounts"] if Path(m["mountPath"]) == path.parent]
    pod = objs[("Deployment", "fp8serve-epp")]["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert path.name in objs[("ConfigMap", volume["configMap"]["name"])]["data"]
    assert pod["serviceAccountName"] in {n for k, n in objs if k == "ServiceAccount"}


def test_rbac_binds_the_epp_account_to_the_pool_and_pods(objs):
    binding = objs[("RoleBinding", "fp8serve-epp")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "fp8serve-epp"}]
    rules = objs[("Role", binding["roleRef"]["name"])]["rules"]
    readable = {(g, r) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]
                if {"get", "list", "watch"} <= set(rule["verbs"])}
    assert {("inference.networking.k8s.io", "inferencepools"), ("", "pods")} <= readable


def test_route_sends_the_openai_api_to_the_pool(objs):
    (rule,) = objs[("HTTPRoute", "fp8serve")]["spec"]["rules"]
    assert rule["matches"] == [{"path": {"type": "PathPrefix", "value": "/v1"}}]
    assert rule["backendRefs"] == [{"group": "inference.networking.k8s.io",
                                    "kind": "InferencePool", "name": "fp8serve"}]


def test_epp_config_references_only_plugins_it_defines(objs):
    cfg = epp_config(objs)
    assert (cfg["apiVersion"], cfg["kind"]) == ("inference.networking.x-k8s.io/v1alpha1",
                                                "EndpointPickerConfig")
    defined = {p.get("name", p["type"]) for p in cfg["plugins"]}
    refs = [p["pluginRef"] for prof in cfg["schedulingProfiles"] for p in prof["plugins"]]
    refs += [s["pluginRef"] for s in cfg["data"]["sources"]]
    refs += [e["pluginRef"] for s in cfg["data"]["sources"] for e in s["extractors"]]
    assert set(refs) <= defined, set(refs) - defined
    assert {"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer"} <= set(refs)


def test_epp_reads_fp8serve_metrics_as_its_default_engine(objs):
    (extractor,) = [p["parameters"] for p in epp_config(objs)["plugins"]
                    if p["type"] == "core-metrics-extractor"]
    engines = {e["name"]: e for e in extractor["engineConfigs"]}
    fp8 = engines[extractor["defaultEngine"]]
    assert all(fp8[k].startswith("fp8serve_") for k in
               ("queuedRequestsSpec", "runningRequestsSpec", "kvUsageSpec"))
    assert fp8["loraSpec"] == fp8["cacheInfoSpec"] == ""  # fp8serve exports neither


def test_prefix_scorer_hashes_in_kv_blocks_up_to_the_model_length(objs, base):
    (prefix,) = [p["parameters"] for p in epp_config(objs)["plugins"]
                 if p["type"] == "prefix-cache-scorer"]
    block = EngineConfig.__dataclass_fields__["kv_block_size"].default
    assert prefix["autoTune"] is False and prefix["blockSizeTokens"] == block
    max_len = int(base[("ConfigMap", "fp8serve-config")]["data"]["FP8SERVE_MAX_MODEL_LEN"])
    assert prefix["maxPrefixBlocksToMatch"] * block == max_len


def test_epp_stays_as_long_as_the_pool_pods_drain(objs, base):
    """The picker routes until the last fp8serve pod of a rollout has drained."""
    def grace(objects: dict, name: str) -> int:
        return objects[("Deployment", name)]["spec"]["template"]["spec"][
            "terminationGracePeriodSeconds"]
    assert grace(objs, "fp8serve-epp") == grace(base, "fp8serve")


def test_losing_one_epp_pod_does_not_stop_traffic(objs, epp_container):
    """Two pickers elect a leader (only it passes readiness, so the Service reaches it
    alone); while none answers, FailOpen lets the gateway pick a pod itself."""
    epp = objs[("Deployment", "fp8serve-epp")]["spec"]
    assert epp["replicas"] >= 2
    assert _flag(epp_container, "ha-enable-leader-election") == "true"
    assert epp_container["readinessProbe"]["grpc"]["service"] == "readiness"
    assert epp_container["livenessProbe"]["grpc"]["service"] == "liveness"
    # a rolling update would wait for a standby to turn Ready, which it never does
    assert epp["strategy"] == {"type": "Recreate"}
    assert objs[("InferencePool", "fp8serve")]["spec"]["endpointPickerRef"][
        "failureMode"] == "FailOpen"
    # the election's Lease, in the picker's namespace
    rules = objs[("Role", "fp8serve-epp")]["rules"]
    (lease,) = [r for r in rules if r["resources"] == ["leases"]]
    assert lease["apiGroups"] == ["coordination.k8s.io"]
    assert {"get", "create", "update"} <= set(lease["verbs"])
    # no PodDisruptionBudget: it would count the leader alone and block its eviction
    assert not [k for k, _ in objs if k == "PodDisruptionBudget"]
