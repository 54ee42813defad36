"""`fp8serve bench vision`: the vision encoder's speed and what an image does to serving.

1. Encode: for each image size, preprocessing + tower + projector wall time, its FLOPs
   (VisionEncoder.flops: every GEMM and the attention products) and GFLOP/s, side by side
   with torch matmul GFLOP/s on the tower's dominant GEMM ([patches, 1024] x [1024, 4096]),
   measured right before and right after the encode (their mean): fp32 x fp32 at that
   shape, and bf16 x bf16 at min(patches, 256) rows (on hosts without AVX-512 BF16
   torch's bf16 GEMM is emulated and takes minutes at the full shape). The ratio against
   the faster of the two is the headline.
2. Fused against unfused (optional, ``--compare-unfused``): the served tower (one q/k/v
   and one gate/up GEMM per layer) and engine/vision/tower_unfused.py on the same
   weights and pixels, alternating round by round in this process so both see the same
   host load, with a torch matmul rate measured between them; the outputs compared.
3. Serving (optional, loads the text model): TTFT of a one-image chat (encode + prefill +
   first token, nothing else running), and the inter-token latency of 4 running streams
   before and while an image is encoded on the encoder thread (engine/vision/runtime.py),
   once per --vision-encoder-threads value given, on the same streams.
No imports from service/."""

from __future__ import annotations

import io
import statistics
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from engine.vision.encoder import VisionEncoder
from engine.vision.preprocess import prepare_image


def noise_png(w: int, h: int, seed: int = 0) -> bytes:
    arr = np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr).save(buf, "PNG")
    return buf.getvalue()


def matmul_rate(m: int, dtype: torch.dtype, k: int = 1024, n: int = 4096,
                reps: int = 1) -> float:
    """GFLOP/s of torch.mm [m, k] x [k, n] in ``dtype``."""
    a, b = torch.randn(m, k).to(dtype), torch.randn(k, n).to(dtype)
    torch.mm(a, b)
    t0 = time.perf_counter()
    for _ in range(reps):
        torch.mm(a, b)
    return 2 * m * k * n * reps / (time.perf_counter() - t0) / 1e9


@dataclass(frozen=True, slots=True)
class EncodeRow:
    width: int
    height: int
    image_tokens: int
    seconds: float
    gflop: float
    gflops: float  # ours, GFLOP/s
    bf16_matmul_gflops: float
    fp32_matmul_gflops: float

    @property
    def ratio(self) -> float:
        """Ours against the faster torch matmul on this host."""
        return self.gflops / max(self.bf16_matmul_gflops, self.fp32_matmul_gflops)


def encode_row(enc: VisionEncoder, w: int, h: int) -> EncodeRow:
    img = Image.open(io.BytesIO(noise_png(w, h)))
    c = enc.config
    patches = (-(-h // c.token_pixels) * 2) * (-(-w // c.token_pixels) * 2)
    before = [matmul_rate(min(patches, 256), torch.bfloat16), matmul_rate(patches, torch.float32)]
    t0 = time.perf_counter()
    prepared = prepare_image(img, c.image_size, c.token_pixels)
    out = enc(prepared.pixels)
    dt = time.perf_counter() - t0
    after = [matmul_rate(min(patches, 256), torch.bfloat16), matmul_rate(patches, torch.float32)]
    px = prepared.pixels.shape
    flops = enc.flops(px[1], px[2])
    return EncodeRow(w, h, out.shape[0], dt, flops / 1e9, flops / dt / 1e9,
                     (before[0] + after[0]) / 2, (before[1] + after[1]) / 2)


@dataclass(frozen=True, slots=True)
class FusionRow:
    width: int
    height: int
    fused_s: list[float]  # per round, encoder call only (pixels already prepared)
    unfused_s: list[float]
    fp32_matmul_gflops: list[float]  # between the two, per round
    gflop: float
    max_abs_diff: float  # fused vs unfused output (0.0: the same bits)

    @property
    def speedup(self) -> float:
        """Median over rounds of unfused / fused time."""
        return statistics.median(u / f for u, f in zip(self.unfused_s, self.fused_s,
                                                       strict=True))


def fusion_row(enc: VisionEncoder, w: int, h: int, rounds: int = 2) -> FusionRow:
    from engine.vision.tower_unfused import UnfusedTower

    img = Image.open(io.BytesIO(noise_png(w, h)))
    pixels = prepare_image(img, enc.config.image_size, enc.config.token_pixels).pixels
    fused_tower, unfused = enc.tower, UnfusedTower(enc.weights, enc.gemm)
    patches = (pixels.shape[1] // enc.config.patch_size) * (pixels.shape[2]
                                                           // enc.config.patch_size)
    times: dict[str, list[float]] = {"fused": [], "unfused": []}
    outs: dict[str, torch.Tensor] = {}
    rates = []
    try:
        for r in range(rounds):
            order = ("fused", "unfused") if r % 2 == 0 else ("unfused", "fused")
            for i, name in enumerate(order):
                enc.tower = fused_tower if name == "fused" else unfused
                t0 = time.perf_counter()
                outs[name] = enc(pixels)
                times[name].append(time.perf_counter() - t0)
                if i == 0:
                    rates.append(matmul_rate(patches, torch.float32))
    finally:
        enc.tower = fused_tower
    diff = float((outs["fused"].float() - outs["unfused"].float()).abs().max())
    return FusionRow(w, h, times["fused"], times["unfused"], rates,
                     enc.flops(pixels.shape[1], pixels.shape[2]) / 1e9, diff)


class _Clock:
    """Token arrival times per request (engine thread -> here)."""

    def __init__(self) -> None:
        self.times: dict[str, list[float]] = {}
        self.lock = threading.Lock()

    def sink(self, rid: str):  # type: ignore[no-untyped-def]
        self.times[rid] = []

        def put(out: Any) -> None:
            if out.token_ids:
                with self.lock:
                    self.times[rid].append(time.perf_counter())
        return put

    def gaps(self, start: float, end: float) -> list[float]:
        with self.lock:
            return [b - a for ts in self.times.values() for a, b in zip(ts, ts[1:],
                                                                         strict=False)
                    if start <= a and b <= end]


def _wait(cond: Any, timeout: float, what: str) -> None:
    end = time.perf_counter() + timeout
    while not cond():
        if time.perf_counter() > end:
            raise RuntimeError(f"bench vision: no {what} within {timeout:.0f} s")
        time.sleep(0.02)


def _pct(xs: list[float], q: float) -> float:
    return sorted(xs)[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def _ttft(engine: Any, vision: Any, tok: Any, image: tuple[int, int], clock: _Clock
          ) -> tuple[float, Any, list[int]]:
    """(TTFT s, the EncodedImage, prompt ids) of one one-image chat, nothing else running."""
    from engine.sampling_params import SamplingParams
    from engine.vision.layout import expand_images
    from engine.vision.prompt_image import PromptImage

    t0 = time.perf_counter()
    e = vision.encode(noise_png(*image, seed=1))
    text = tok.encode("Describe this image:", add_special_tokens=True)
    prompt, starts = expand_images(text + [vision.ids.img], [e.grid], vision.ids)
    params = SamplingParams(max_tokens=1, temperature=0.0)
    engine.add_request("img", prompt, params, clock.sink("img"),
                       images=(PromptImage(starts[0], e.grid, e.key, e.features),))
    _wait(lambda: clock.times["img"], 3600, "first token of the image chat")
    ttft = clock.times["img"][0] - t0
    del clock.times["img"]
    return ttft, e, prompt


def _during(vision: Any, image: tuple[int, int], seed: int, clock: _Clock
            ) -> dict[str, Any]:
    """Encode one image while the streams run; their inter-token gaps in that window."""
    t0 = time.perf_counter()
    e = vision.encode(noise_png(*image, seed=seed))
    t1 = time.perf_counter()
    gaps = clock.gaps(t0, t1)
    return {"encoder_threads": vision.worker.effective, "encode_s": e.seconds,
            "itl_median_s": statistics.median(gaps) if gaps else None,
            "itl_p90_s": _pct(gaps, 0.9), "itl_max_s": max(gaps) if gaps else None,
            "tokens": len(gaps), "window_s": t1 - t0}


def serving_latency(model_dir: Path, image: tuple[int, int], baseline_s: float = 20.0,
                    encoder_threads: tuple[int | None, ...] = (None,)) -> dict[str, Any]:
    """TTFT of one one-image chat alone; ITL of 4 streams before, then during one encode
    per entry of ``encoder_threads`` (--vision-encoder-threads; None: the engine's
    count), one after the other on the same engine and streams."""
    from engine.config import EngineConfig
    from engine.engine import Engine
    from engine.runner import load_runner
    from engine.sampling_params import SamplingParams
    from engine.text.tokenizer import Tokenizer
    from engine.vision.encoder import load_vision_encoder
    from engine.vision.layout import ImageTokenIds
    from engine.vision.runtime import VisionLimits, VisionRuntime

    cfg = EngineConfig(model_dir=model_dir, max_num_seqs=5, max_model_len=4096,
                       kv_cache_gib=0.5, max_num_batched_tokens=512)
    tok = Tokenizer.from_dir(model_dir)
    ids = ImageTokenIds.from_tokenizer(tok)
    enc = load_vision_encoder(model_dir)
    assert ids is not None and enc is not None
    limits = VisionLimits(1, enc.config.image_size, cache_bytes=0)
    runtimes = [VisionRuntime(enc, ids, limits, encoder_threads=t) for t in encoder_threads]
    engine = Engine(load_runner(model_dir, cfg), tok, cfg)
    engine.start()
    clock = _Clock()
    try:
        ttft, e, prompt = _ttft(engine, runtimes[0], tok, image, clock)
        long = SamplingParams(max_tokens=4000, temperature=0.0, ignore_eos=True)
        for i in range(4):
            engine.add_request(f"s{i}", tok.encode(f"Count to {i + 5}.", True), long,
                               clock.sink(f"s{i}"))
        _wait(lambda: all(len(t) >= 2 for t in clock.times.values()), 3600,
              "tokens from the 4 streams")
        b0 = time.perf_counter()
        time.sleep(baseline_s)
        base = clock.gaps(b0, time.perf_counter())
        during = [_during(v, image, 2 + i, clock) for i, v in enumerate(runtimes)]
        for i in range(4):
            engine.abort(f"s{i}")
    finally:
        engine.shutdown()
        for v in runtimes:
            v.worker.close()
    return {"image": list(image), "image_tokens": e.grid.num_image_tokens,
            "prompt_tokens": len(prompt), "encode_s": e.seconds, "ttft_s": ttft,
            "engine_threads": torch.get_num_threads(),
            "itl_baseline_median_s": statistics.median(base) if base else None,
            "itl_baseline_p90_s": _pct(base, 0.9), "during_encode": during}
