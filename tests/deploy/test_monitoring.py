"""Monitoring files against the server's real metrics: every metric name the alerts, the
dashboard and the autoscalers use is one a scrape of service/metrics.py's registry
exports; the PrometheusRule holds exactly deploy/prometheus/alerts.yml's rules; the
dashboard has the panels operators need; compose wires Prometheus and Grafana to them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml
from prometheus_client import generate_latest

from cli.serve import END_GRACE_S
from service.backend import ServingState
from service.metrics import build_registry
from service.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
DASHBOARD = json.loads((DEPLOY / "grafana/dashboards/fp8serve.json").read_text())
ALERTS = yaml.safe_load((DEPLOY / "prometheus/alerts.yml").read_text())
COMPOSE = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())

REPORT = {  # one layer fell back at startup, one at run time, one runs generated rows on
    # another kernel (AMX hosts): every kernel family has samples
    "layers": [
        {"layer": "model.layers.0.self_attn.o_proj", "kernel_id": "amx_w8a16",
         "platform": "cpu", "scale_kind": "per_tensor", "n": 8, "k": 8, "rejections": [],
         "warning": None, "first_choice": "amx_w8a16", "generated_kernel_id": "avx512_w8a16"},
        {"layer": "model.layers.0.self_attn.qkv_proj", "kernel_id": "torch_w8a16",
         "platform": "cpu", "scale_kind": "per_tensor", "n": 8, "k": 8,
         "rejections": [{"kernel_id": "avx512_w8a16", "reason": "shape"}],
         "warning": None, "first_choice": "avx512_w8a16"},
        {"layer": "model.layers.0.mlp.down_proj", "kernel_id": "torch_w8a16",
         "platform": "cpu", "scale_kind": "per_tensor", "n": 8, "k": 8, "rejections": [],
         "warning": None, "first_choice": "avx512_w8a16"}],
    "runtime_fallbacks": [{"layer": "model.layers.0.mlp.down_proj",
                           "from_kernel": "avx512_w8a16", "to_kernel": "torch_w8a16",
                           "error": "boom", "stage": "apply"}],
    "decoder_layers": [{"index": 0, "path": "python",
                        "reason": "qkv_proj runs torch_w8a16 (w[N,K]), not the AVX-512, "
                                  "AMX or AVX2 FP8 kernel"}],
}


@pytest.fixture(scope="module")
def exported() -> set[str]:
    """Sample names of a scrape (with _total, _bucket, ... suffixes)."""
    stats = SimpleNamespace(num_running=1, num_waiting=2, kv_cache_usage=0.5)
    registry, metrics = build_registry("m", lambda: stats, lambda: REPORT, {"avx2": True},
                                       {"built": "true"}, ServingState(Settings()).store_stats)
    metrics.on_rejected("queue_full")
    text = generate_latest(registry).decode()
    return {line.split("{")[0].split(" ")[0] for line in text.splitlines()
            if line and not line.startswith("#")}


def _exprs() -> dict[str, list[str]]:
    adapter = yaml.safe_load((K8S / "autoscaling/hpa/prometheus-adapter-values.yaml").read_text())
    keda = yaml.safe_load((K8S / "autoscaling/keda/scaledobject.yaml").read_text())
    hpa = yaml.safe_load((K8S / "autoscaling/hpa/hpa.yaml").read_text())
    epp_map = yaml.safe_load((K8S / "inference-gateway/epp-config.yaml").read_text())
    epp = yaml.safe_load(epp_map["data"]["epp-config.yaml"])
    return {
        "alerts.yml": [r["expr"] for g in ALERTS["groups"] for r in g["rules"]],
        "dashboard": [t["expr"] for p in DASHBOARD["panels"] for t in p.get("targets", [])],
        "prometheus-adapter": [r[k] for r in adapter["rules"]["custom"]
                               for k in ("seriesQuery", "metricsQuery")],
        "keda": [t["metadata"]["query"] for t in keda["spec"]["triggers"]],
        "hpa": [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"]],
        "inference-gateway EPP": [spec for p in epp["plugins"]
                                  if p["type"] == "core-metrics-extractor"
                                  for e in p["parameters"]["engineConfigs"]
                                  for spec in e.values()],
    }


@pytest.mark.parametrize("source", list(_exprs()))
def test_every_metric_used_is_exported(source, exported):
    names = {n for e in _exprs()[source] for n in re.findall(r"\bfp8serve_\w+", e)}
    assert names, source
    assert names <= exported, names - exported


def test_prometheusrule_holds_exactly_the_alerts_file():
    (rule,) = [d for d in yaml.safe_load_all((K8S / "monitoring/prometheusrule.yaml").read_text())]
    assert (rule["apiVersion"], rule["kind"]) == ("monitoring.coreos.com/v1", "PrometheusRule")
    assert rule["spec"] == ALERTS


def test_alerts_cover_kernel_fallbacks_and_load():
    by_name = {r["alert"]: r["expr"] for g in ALERTS["groups"] for r in g["rules"]}
    wanted = {"Fp8serveTorchKernel": 'fp8serve_kernel_selected{kernel=~"torch_.*"}',
              "Fp8serveKernelStartupFallback": "fp8serve_kernel_startup_fallbacks",
              "Fp8serveKernelRuntimeFallback": "fp8serve_kernel_runtime_fallbacks_total",
              "Fp8serveDecoderNotFused": 'fp8serve_decoder_layers{path="python"}',
              "Fp8serveExactnessOff": "fp8serve_batch_invariant",
              "Fp8serveQueueBacklog": "fp8serve_num_requests_waiting",
              "Fp8serveKvCacheFull": "fp8serve_kv_cache_usage_perc"}
    for alert, metric in wanted.items():
        assert metric in by_name[alert], alert


def _panel(title: str) -> list[str]:
    (panel,) = [p for p in DASHBOARD["panels"] if p["title"] == title]
    assert panel["datasource"]["uid"] == _datasource_uid()
    return [t["expr"] for t in panel["targets"]]


def _datasource_uid() -> str:
    ds = yaml.safe_load((DEPLOY / "grafana/provisioning/datasources/prometheus.yml").read_text())
    (source,) = ds["datasources"]
    return source["uid"]


@pytest.mark.parametrize("title,needles", [
    ("Kernel per layer group", ["fp8serve_layer_group_kernel", "layer_group, kernel",
                                "fp8serve_layer_group_generated_rows_kernel"]),
    ("Startup fallbacks", ["fp8serve_kernel_startup_fallbacks", "from_kernel, to_kernel"]),
    ("Runtime fallbacks", ["fp8serve_kernel_runtime_fallbacks_total"]),
    ("Decoder layers off the fused op", ['fp8serve_decoder_layers{path="python"']),
    ("Time to first token", ["histogram_quantile(0.5,", "histogram_quantile(0.99,",
                             "rate(fp8serve_time_to_first_token_seconds_bucket"]),
    ("Inter-token latency", ["histogram_quantile(0.95,",
                             "rate(fp8serve_inter_token_latency_seconds_bucket"]),
    ("Token throughput", ["rate(fp8serve_prompt_tokens_total",
                          "rate(fp8serve_generation_tokens_total"]),
    ("Running and waiting requests", ["fp8serve_num_requests_running",
                                      "fp8serve_num_requests_waiting"]),
    ("KV cache usage", ["fp8serve_kv_cache_usage_perc"]),
    ("Engine step time by kind", ["rate(fp8serve_engine_step_seconds_bucket", "le, kind"]),
    ("Prefix cache hit rate", ["rate(fp8serve_prefix_cache_hits_total",
                               ") / sum by (instance) (rate(fp8serve_prefix_cache_queries_total"]),
    ("Speculative decoding acceptance rate",
     ["rate(fp8serve_spec_decode_num_accepted_tokens_total",
      ") / sum by (instance) (rate(fp8serve_spec_decode_num_draft_tokens_total"]),
    ("Stores: share of budget", ["fp8serve_responses_store_bytes",
                                 "fp8serve_conversations_store_budget_bytes"]),
    ("Background responses running", ["fp8serve_background_responses_running"]),
    ("Tokens per verified draft", ["1 + sum by (instance) (rate("
                                   "fp8serve_spec_decode_num_accepted_tokens_total",
                                   "rate(fp8serve_spec_decode_num_drafts_total"]),
])
def test_dashboard_has_the_panel(title, needles):
    text = "\n".join(_panel(title))
    for needle in needles:
        assert needle in text, (title, needle)


def test_dashboard_panels_do_not_overlap():
    cells = set()
    for p in DASHBOARD["panels"]:
        g = p["gridPos"]
        new = {(x, y) for x in range(g["x"], g["x"] + g["w"])
               for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & new, p["title"]
        assert g["x"] + g["w"] <= 24
        cells |= new


def test_compose_wires_prometheus_and_grafana_to_the_files():
    svc = COMPOSE["services"]
    for name in ("prometheus", "grafana"):
        image = svc[name]["image"]
        assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+", image), f"{name}: unpinned {image}"
    mounts = {m.split(":")[1]: (DEPLOY / m.split(":")[0]) for s in svc.values()
              for m in s.get("volumes", []) if m.startswith("./")}
    for target, source in mounts.items():
        assert source.exists(), (target, source)
    prom = yaml.safe_load(mounts["/etc/prometheus/prometheus.yml"].read_text())
    for rule_file in prom["rule_files"]:
        assert f"/etc/prometheus/{rule_file}" in mounts
    (job,) = prom["scrape_configs"]
    assert job["static_configs"][0]["targets"] == ["fp8serve:8000"]
    provider = yaml.safe_load((mounts["/etc/grafana/provisioning"]
                               / "dashboards/fp8serve.yml").read_text())["providers"][0]
    assert provider["options"]["path"] in mounts
    home = svc["grafana"]["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert (mounts[provider["options"]["path"]] / Path(home).name).is_file()


def test_compose_stop_grace_covers_the_drain_timeout():
    fp8 = COMPOSE["services"]["fp8serve"]
    drain = re.fullmatch(r"\$\{FP8SERVE_DRAIN_TIMEOUT:-(\d+)\}",
                         fp8["environment"]["FP8SERVE_DRAIN_TIMEOUT"])
    # then the last answers go out (END_GRACE_S) and the engine stops (its join: 5 s)
    assert int(fp8["stop_grace_period"].rstrip("s")) > int(drain.group(1)) + END_GRACE_S + 5
