"""engine/memory.py: releasing mapped checkpoint pages, WeightSource, and LayerKernel /
fused linears keeping only their packed weights (runtime fallback still re-prepares)."""

from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from engine.checkpoint.tensors import TensorStore
from engine.hardware import HardwareInfo
from engine.kernels.base import Fp8Weight, Platform, ScaleKind
from engine.kernels.layer_kernel import KernelReport, LayerKernel
from engine.kernels.reference import random_fp8_weight, reference_linear
from engine.kernels.registry import KernelCatalog, KernelOverrides
from engine.memory import PAGE, WeightSource, mapping_of, page_span, release_pages, trim_heap
from engine.model.layers import LinearFactory, fp8_fuse_reason, fuse_fp8
from tests.kernels.test_registry import FakeKernel

HW = HardwareInfo.fake("avx2", "fma", "f16c")
TABLE = ("avx512_w8a16", "avx2_w8a16", "torch_w8a16")
MIB = 2**20


def rss_file() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("RssFile:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no RssFile in /proc/self/status")


def catalog(*kernels: FakeKernel) -> KernelCatalog:
    return KernelCatalog(
        kernels={k.id: (lambda k=k: k) for k in kernels},
        priority={(Platform.CPU, kind): TABLE for kind in ScaleKind})


@pytest.fixture
def mapped(tmp_path: Path) -> TensorStore:
    """A checkpoint with a 32 MiB fp8 weight and a small one, opened memory-mapped."""
    g = torch.Generator().manual_seed(0)
    big = (torch.randn(4096, 8192, generator=g) * 8).to(torch.float8_e4m3fn)
    small = (torch.randn(64, 8192, generator=g) * 8).to(torch.float8_e4m3fn)
    save_file({"big": big, "small": small}, str(tmp_path / "w.safetensors"))
    return TensorStore(tmp_path, ["w.safetensors"])


def test_page_span_keeps_partial_pages() -> None:
    assert page_span(PAGE, 3 * PAGE) == (PAGE, 3 * PAGE)
    assert page_span(PAGE + 1, 3 * PAGE) == (2 * PAGE, 2 * PAGE)  # both ends partial
    assert page_span(PAGE + 1, 10) == (2 * PAGE, 0)


def test_release_pages_drops_resident_mapped_pages_losslessly(mapped: TensorStore) -> None:
    t = mapped.get("big")
    m = mapping_of(t.data_ptr())
    assert m is not None and m.private_file and m.path.endswith("w.safetensors")
    before = rss_file()
    checksum = int(t.view(torch.uint8).sum(dtype=torch.int64))  # touch every page
    assert rss_file() - before > 24 * MIB
    released = release_pages(t)
    assert released >= 32 * MIB - 2 * PAGE
    assert rss_file() - before < 4 * MIB
    # re-read from the file: same bytes
    assert int(t.view(torch.uint8).sum(dtype=torch.int64)) == checksum


def test_release_pages_ignores_anonymous_tensors() -> None:
    t = torch.ones(4 * MIB, dtype=torch.uint8)
    assert release_pages(t) == 0
    assert int(t.sum()) == 4 * MIB  # untouched
    assert release_pages(torch.empty(0)) == 0


def _shards(kind: ScaleKind = ScaleKind.PER_TENSOR) -> list[Fp8Weight]:
    return [random_fp8_weight(n, 64, kind, seed=i) for i, n in enumerate((64, 32, 32))]


def test_weight_source_builds_and_validates() -> None:
    w = random_fp8_weight(32, 64, ScaleKind.PER_TENSOR)
    assert WeightSource.of(w).build() is w
    src = WeightSource(tuple(_shards()), combine=fuse_fp8)  # type: ignore[arg-type]
    fused = src.build()
    assert fused.n == 128 and fused.scale_kind is ScaleKind.PER_CHANNEL
    assert src.release() == 0  # anonymous shards: nothing to release
    with pytest.raises(ValueError, match="combine"):
        WeightSource(tuple(_shards()))


def test_fuse_reason_reads_no_data() -> None:
    assert fp8_fuse_reason(_shards()) is None
    ragged = [random_fp8_weight(64, 64, ScaleKind.PER_TENSOR),
              random_fp8_weight(32, 128, ScaleKind.PER_TENSOR)]
    assert fp8_fuse_reason(ragged) == "shards differ in K"
    assert fuse_fp8(ragged) is None


def _tracking_source(shards: list[Fp8Weight]) -> tuple[WeightSource, list[weakref.ref]]:
    built: list[weakref.ref] = []

    def combine(ws: list[Fp8Weight]) -> Fp8Weight:
        fused = fuse_fp8(ws)
        assert fused is not None
        built.append(weakref.ref(fused.weight))
        return fused

    return WeightSource(tuple(shards), combine=combine), built


def test_fused_copy_is_dropped_after_prepare() -> None:
    """A kernel that packs into its own buffer: the fused fp8 copy dies after prepare."""

    class CopyingKernel(FakeKernel):
        def prepare(self, w):  # type: ignore[no-untyped-def]
            packed = super().prepare(w)
            clone = Fp8Weight(w.weight.clone(), w.scale.clone(), w.scale_kind,
                              w.activation_scale, w.block_size)
            packed.meta["w"] = clone
            return packed

    src, built = _tracking_source(_shards())
    lk = LayerKernel("l", src, HW, KernelOverrides(), KernelReport(),
                     catalog=catalog(CopyingKernel("avx2_w8a16")))
    gc.collect()
    assert len(built) == 1 and built[0]() is None  # no reference to the fused copy
    assert lk.source is src
    assert (lk.n, lk.k) == (128, 64)


def test_fused_runtime_fallback_refuses_and_is_correct() -> None:
    shards = _shards(ScaleKind.PER_CHANNEL)
    src, built = _tracking_source(shards)
    report = KernelReport()
    cat = catalog(FakeKernel("avx2_w8a16", fail_apply=1), FakeKernel("torch_w8a16"))
    lk = LayerKernel("l.qkv", src, HW, KernelOverrides(), report, catalog=cat)
    xs = torch.randn(3, 64, generator=torch.Generator().manual_seed(2)).to(torch.bfloat16)
    y = lk(xs)
    assert lk.kernel.id == "torch_w8a16" and len(built) == 2  # fused again from the shards
    want = torch.cat([reference_linear(w, xs) for w in shards], dim=1).to(torch.bfloat16)
    torch.testing.assert_close(y, want)
    assert report.fallback_counts() == {("avx2_w8a16", "torch_w8a16"): 1}


def test_factory_fuses_through_a_source() -> None:
    make = LinearFactory(HardwareInfo.fake(), KernelOverrides(), KernelReport())
    shards = _shards()
    fused = make.fused("l.qkv", dict(zip("qkv", shards, strict=True)))
    assert fused.is_fused
    lk = fused.modules[0].kernel  # type: ignore[union-attr]
    assert lk.source.parts == tuple(shards)
    xs = torch.randn(2, 64).to(torch.bfloat16)
    outs = fused(xs)
    for out, w in zip(outs, shards, strict=True):
        ref = reference_linear(w, xs)
        assert (out.float() - ref).abs().max() <= 2e-2 * ref.abs().max() + 1e-3


def test_layer_kernel_releases_mapped_pages_after_prepare(mapped: TensorStore) -> None:
    """Packing reads the whole mapped weight; afterwards its pages are not resident."""

    class CopyingKernel(FakeKernel):
        def prepare(self, w):  # type: ignore[no-untyped-def]
            packed = super().prepare(w)
            packed.tensors["copy"] = w.weight.clone()
            return packed

    w = Fp8Weight(mapped.get("big"), torch.tensor(0.5), ScaleKind.PER_TENSOR)
    before = rss_file()
    lk = LayerKernel("big", w, HW, KernelOverrides(), KernelReport(),
                     catalog=catalog(CopyingKernel("avx2_w8a16")))
    assert lk.packed.tensors["copy"].shape == (4096, 8192)
    assert rss_file() - before < 4 * MIB


def test_trim_heap_calls_glibc() -> None:
    assert trim_heap() is True  # the supported hosts and the image run glibc
