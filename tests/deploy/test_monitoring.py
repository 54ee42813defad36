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

from service.backend import ServingState
from service.metrics import build_registry
from service.settings import Settings
from tests.deploy.shutdown import DEFAULT_DRAIN_S, stop_seconds

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


def test_compose_publishes_on_localhost_unless_told():
    """The API without a key and Grafana's anonymous viewer stay on the host, as `serve`
    binds 127.0.0.1 by default; PUBLISH_ADDR opens them."""
    published = [p for svc in COMPOSE["services"].values() for p in svc.get("ports", [])]
    assert len(published) == 3
    for port in published:
        assert re.fullmatch(r"\$\{PUBLISH_ADDR:-127\.0\.0\.1\}:(\d+):\1", port), port


def test_compose_stop_grace_covers_the_drain_and_the_shutdown():
    """docker stop waits stop_grace_period, then SIGKILLs: past the drain, the server
    still answers the requests it ended and stops uvicorn and the engine."""
    fp8 = COMPOSE["services"]["fp8serve"]
    drain = re.fullmatch(r"\$\{FP8SERVE_DRAIN_TIMEOUT:-(\d+)\}",
                         fp8["environment"]["FP8SERVE_DRAIN_TIMEOUT"])
    assert float(drain.group(1)) == DEFAULT_DRAIN_S  # the server's own default
    grace = re.fullmatch(r"(\d+)s", fp8["stop_grace_period"])
    assert int(grace.group(1)) > stop_seconds(float(drain.group(1)))


def _histogram_quantile(q: float, buckets: list[tuple[float, float]]) -> float:
    """Prometheus' histogram_quantile over cumulative (le, count) pairs, +Inf last: linear
    within the bucket the rank falls in, the first bucket starting at 0."""
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for le, count in buckets:
        if count >= rank:
            if le == float("inf"):
                return lower
            return lower + (le - lower) * (rank - below) / (count - below)
        lower, below = le, count
    raise AssertionError("no bucket")


# (dashboard panel, histogram, feed one observation of ``seconds``, a value a server that
# keeps up sees): the panel's p50 and p99 must read it within a factor of 2.5
_HEALTHY = [
    ("Queue time", "request_queue_time_seconds", lambda m, s: m.on_admitted(s, 8), 0.002),
    ("Time to first token", "time_to_first_token_seconds", lambda m, s: m.on_first_token(s),
     0.05),
    ("Inter-token latency", "inter_token_latency_seconds", lambda m, s: m.on_token(s), 0.03),
    ("Engine step time by kind", "engine_step_seconds", lambda m, s: m.on_step(s, 4, 0),
     0.02),
]


@pytest.mark.parametrize("title,name,feed,seconds", _HEALTHY, ids=[h[0] for h in _HEALTHY])
def test_latency_panels_resolve_a_healthy_server(title, name, feed, seconds):
    """The quantiles a latency panel draws come from the histogram's buckets: a bucket
    much wider than the values (request_queue_time_seconds had e2e's, from 0.3 s) makes
    the panel show its interpolation, not the latency (0.15 s for waits of 2 ms)."""
    from prometheus_client.parser import text_string_to_metric_families

    assert f"rate(fp8serve_{name}_bucket" in "\n".join(_panel(title))
    stats = SimpleNamespace(num_running=0, num_waiting=0, kv_cache_usage=0.0)
    registry, metrics = build_registry("m", lambda: stats, lambda: REPORT, {}, {})
    for _ in range(100):
        feed(metrics, seconds)
    (family,) = [f for f in text_string_to_metric_families(generate_latest(registry).decode())
                 if f.name == f"fp8serve_{name}"]
    counts: dict[float, float] = {}
    for s in family.samples:
        if s.name.endswith("_bucket"):
            le = float(s.labels["le"])
            counts[le] = counts.get(le, 0.0) + s.value
    buckets = sorted(counts.items())
    for q in (0.5, 0.99):
        shown = _histogram_quantile(q, buckets)
        assert seconds / 2.5 <= shown <= seconds * 2.5, (title, q, shown)
