"""Prometheus metrics of image input (fed by engine/vision/runtime.py's observer hook, on
the request threads that encode)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Histogram

P = "fp8serve_"
ENCODE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)


class VisionMetrics:
    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        lbl = ["model_name"]
        self.encoded = Counter(P + "images_encoded", "Images run through the vision tower.",
                               lbl, registry=registry).labels(model_name)
        self.seconds = Histogram(P + "image_encode_seconds", "Preprocessing + vision tower "
                                 "+ projector time per encoded image.", lbl,
                                 buckets=ENCODE_BUCKETS, registry=registry).labels(model_name)
        self.tokens = Counter(P + "image_tokens", "[IMG] tokens of images in prompts "
                              "(encoded or cached).", lbl, registry=registry).labels(model_name)
        self.hits = Counter(P + "image_cache_hits", "Images served from the encoded-image "
                            "cache.", lbl, registry=registry).labels(model_name)

    def on_image(self, seconds: float, num_tokens: int, cached: bool) -> None:
        self.tokens.inc(num_tokens)
        if cached:
            self.hits.inc()
        else:
            self.encoded.inc()
            self.seconds.observe(seconds)
