"""Registry selection logic on fake kernels (real ids, a test-owned catalog)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from engine.hardware import HardwareInfo
from engine.kernels.base import (
    Fp8Kernel,
    Fp8Spec,
    Fp8Weight,
    PackedWeight,
    Platform,
    ScaleKind,
)
from engine.kernels.reference import reference_linear
from engine.kernels.registry import (
    DISABLED_REASON,
    KernelCatalog,
    KernelOverrides,
    NoKernelError,
    Rejection,
    candidate_ids,
    overrides_from,
    select_kernel,
    table_infos,
)


class FakeKernel(Fp8Kernel):
    """A scripted kernel under a real id (also used by test_layer_kernel.py). Computes
    the oracle; ``unsupported`` / ``cannot`` script the two checks,
    ``fail_apply`` / ``fail_prepare`` make the first N calls raise."""

    platform = Platform.CPU

    def __init__(self, kid: str, kinds: frozenset[ScaleKind] = frozenset(ScaleKind),
                 unsupported: str | Callable[[HardwareInfo], str | None] | None = None,
                 cannot: str | None = None, fail_apply: int = 0,
                 fail_prepare: int = 0) -> None:
        self.id = kid  # type: ignore[misc]
        self.scale_kinds = kinds  # type: ignore[misc]
        self._unsupported = unsupported
        self._cannot = cannot
        self.fail_apply = fail_apply
        self.fail_prepare = fail_prepare
        self.apply_calls = 0

    def is_supported(self, hw: HardwareInfo) -> str | None:
        if callable(self._unsupported):
            return self._unsupported(hw)
        return self._unsupported

    def can_implement(self, spec: Fp8Spec) -> str | None:
        return self._cannot or super().can_implement(spec)

    def prepare(self, w: Fp8Weight) -> PackedWeight:
        if self.fail_prepare:
            self.fail_prepare -= 1
            raise RuntimeError(f"{self.id} cannot pack")
        return PackedWeight(self.id, "fake", w.n, w.k, {}, {"w": w})

    def apply(self, packed: PackedWeight, x: torch.Tensor,
              bias: torch.Tensor | None = None) -> torch.Tensor:
        self.apply_calls += 1
        if self.fail_apply:
            self.fail_apply -= 1
            raise RuntimeError(f"{self.id} exploded")
        return reference_linear(packed.meta["w"], x, bias).to(torch.bfloat16)  # type: ignore[arg-type]


def factory(kernel: Fp8Kernel) -> Callable[[], Fp8Kernel]:
    return lambda: kernel


PT = Fp8Spec(n=64, k=128, scale_kind=ScaleKind.PER_TENSOR, has_activation_scale=True)
BLOCK = Fp8Spec(n=64, k=128, scale_kind=ScaleKind.BLOCK)
HW = HardwareInfo.fake("avx2")
W8A16_KINDS = frozenset({ScaleKind.PER_TENSOR, ScaleKind.PER_CHANNEL})
TABLE = ("amx_w8a16", "avx512_w8a16", "avx2_w8a16", "torch_w8a16")


def catalog(**kernels: FakeKernel) -> KernelCatalog:
    return KernelCatalog(
        kernels={kid: factory(k) for kid, k in kernels.items()},
        priority={(Platform.CPU, ScaleKind.PER_TENSOR): TABLE,
                  (Platform.CPU, ScaleKind.BLOCK): ("avx512_block_w8a16", "torch_block_w8a16")},
    )


def standard() -> KernelCatalog:
    return catalog(
        amx_w8a16=FakeKernel("amx_w8a16", unsupported="no AMX"),
        avx512_w8a16=FakeKernel("avx512_w8a16", unsupported="no avx512f"),
        avx2_w8a16=FakeKernel("avx2_w8a16", kinds=W8A16_KINDS),
        torch_w8a16=FakeKernel("torch_w8a16", kinds=W8A16_KINDS),
        avx512_block_w8a16=FakeKernel("avx512_block_w8a16", unsupported="no avx512f"),
        torch_block_w8a16=FakeKernel("torch_block_w8a16"),
    )


def test_first_usable_wins_and_earlier_ones_are_rejected_with_reasons() -> None:
    sel = select_kernel(PT, HW, catalog=standard())
    assert sel.kernel.id == "avx2_w8a16"
    assert sel.rejections == (Rejection("amx_w8a16", "no AMX"),
                              Rejection("avx512_w8a16", "no avx512f"))
    assert [k.id for k in sel.fallbacks] == ["torch_w8a16"]
    assert sel.warning is None


def test_can_implement_rejection_is_recorded() -> None:
    cat = catalog(amx_w8a16=FakeKernel("amx_w8a16", cannot="N=64 not a multiple of 128"),
                  avx512_w8a16=FakeKernel("avx512_w8a16"))
    sel = select_kernel(PT, HW, catalog=cat)
    assert sel.kernel.id == "avx512_w8a16"
    assert sel.rejections[0] == Rejection("amx_w8a16", "N=64 not a multiple of 128")
    # the rest of the table is missing from this catalog: not fallbacks, not rejections
    assert sel.fallbacks == ()


def test_disabled_kernels_are_skipped_and_recorded() -> None:
    ov = KernelOverrides(disabled=frozenset({"avx2_w8a16"}))
    sel = select_kernel(PT, HW, ov, catalog=standard())
    assert sel.kernel.id == "torch_w8a16"
    assert Rejection("avx2_w8a16", DISABLED_REASON) in sel.rejections


def test_forced_kernel_goes_first_even_below_a_better_one() -> None:
    ov = KernelOverrides(forced="torch_w8a16")
    sel = select_kernel(PT, HW, ov, catalog=standard())
    assert sel.kernel.id == "torch_w8a16" and sel.warning is None
    assert sel.rejections == ()
    assert [k.id for k in sel.fallbacks] == ["avx2_w8a16"]
    assert candidate_ids(Platform.CPU, ScaleKind.PER_TENSOR, ov, standard())[0] == "torch_w8a16"


def test_forced_kernel_that_cannot_run_falls_back_with_warning() -> None:
    ov = KernelOverrides(forced="avx512_w8a16")
    sel = select_kernel(PT, HW, ov, catalog=standard())
    assert sel.kernel.id == "avx2_w8a16"
    assert sel.warning is not None
    assert "avx512_w8a16" in sel.warning and "no avx512f" in sel.warning
    assert "avx2_w8a16" in sel.warning


def test_forced_kernel_of_another_scale_kind_falls_back_for_block_layers() -> None:
    ov = KernelOverrides(forced="avx2_w8a16")
    sel = select_kernel(BLOCK, HW, ov, catalog=standard())
    assert sel.kernel.id == "torch_block_w8a16"
    assert sel.rejections[0].kernel_id == "avx2_w8a16"
    assert "scale kind block not handled" in sel.rejections[0].reason
    assert sel.warning and "avx2_w8a16" in sel.warning


def test_forced_kernel_missing_from_catalog_is_a_warning_not_a_crash() -> None:
    ov = KernelOverrides(forced="xpu_w8a16")
    sel = select_kernel(PT, HW, ov, catalog=standard())
    assert sel.kernel.id == "avx2_w8a16"
    assert sel.rejections[0] == Rejection("xpu_w8a16", "not in this build's kernel catalog")


def test_nothing_usable_lists_every_reason() -> None:
    cat = catalog(amx_w8a16=FakeKernel("amx_w8a16", unsupported="no AMX"),
                  torch_w8a16=FakeKernel("torch_w8a16", unsupported="broken"))
    with pytest.raises(NoKernelError) as err:
        select_kernel(PT, HW, KernelOverrides(disabled=frozenset({"avx2_w8a16"})), catalog=cat)
    msg = str(err.value)
    for part in ("amx_w8a16: no AMX", "torch_w8a16: broken", "avx2_w8a16: disabled",
                 "avx512_w8a16: not in this build", "per_tensor [N=64, K=128]"):
        assert part in msg


def test_raising_checks_and_failed_imports_reject_instead_of_crashing() -> None:
    def boom(hw: HardwareInfo) -> str | None:
        raise OSError("cpuid exploded")

    cat = KernelCatalog(
        kernels={"amx_w8a16": "engine.kernels.no_such_module:Nope",
                 "avx512_w8a16": factory(FakeKernel("avx512_w8a16", unsupported=boom)),
                 "avx2_w8a16": factory(FakeKernel("avx2_w8a16"))},
        priority={(Platform.CPU, ScaleKind.PER_TENSOR): TABLE[:3]})
    sel = select_kernel(PT, HW, catalog=cat)
    assert sel.kernel.id == "avx2_w8a16"
    amx, avx512 = sel.rejections
    assert amx.reason.startswith("kernel module unavailable: ModuleNotFoundError")
    assert avx512.reason == "is_supported raised OSError: cpuid exploded"


def test_kernel_instances_are_cached_per_catalog() -> None:
    made = []

    def make() -> FakeKernel:
        made.append(1)
        return FakeKernel("torch_w8a16")

    cat = KernelCatalog(kernels={"torch_w8a16": make},
                        priority={(Platform.CPU, ScaleKind.PER_TENSOR): ("torch_w8a16",)})
    for _ in range(3):
        select_kernel(PT, HW, catalog=cat)
    assert len(made) == 1


def test_platform_follows_accelerators() -> None:
    cat = KernelCatalog(
        kernels={"xpu_torch_w8a16": factory(FakeKernel("xpu_torch_w8a16")),
                 "cuda_torch_w8a16": factory(FakeKernel("cuda_torch_w8a16"))},
        priority={(Platform.XPU, ScaleKind.PER_TENSOR): ("xpu_torch_w8a16",),
                  (Platform.CUDA, ScaleKind.PER_TENSOR): ("cuda_torch_w8a16",)})
    xpu = HardwareInfo.fake(xpu_available=True, cuda_available=True)
    cuda = HardwareInfo.fake(cuda_available=True)
    assert select_kernel(PT, xpu, catalog=cat).kernel.id == "xpu_torch_w8a16"
    assert select_kernel(PT, cuda, catalog=cat).kernel.id == "cuda_torch_w8a16"
    with pytest.raises(NoKernelError, match="empty table"):
        select_kernel(PT, HW, catalog=cat)


# -- overrides ----------------------------------------------------------------------


def test_unknown_ids_are_refused() -> None:
    with pytest.raises(ValueError, match="avx9000"):
        KernelOverrides(forced="avx9000")
    with pytest.raises(ValueError, match="nope"):
        overrides_from(None, "torch_w8a16,nope", env={})


def test_overrides_from_env() -> None:
    env = {"FP8SERVE_KERNEL": "avx2_w8a16",
           "FP8SERVE_DISABLED_KERNELS": " amx_w8a16, ,avx512_w8a16 "}
    ov = KernelOverrides.from_env(env)
    assert ov.forced == "avx2_w8a16"
    assert ov.disabled == {"amx_w8a16", "avx512_w8a16"}
    assert KernelOverrides.from_env({}) == KernelOverrides()


def test_cli_values_override_env_forced_and_add_to_disabled() -> None:
    env = {"FP8SERVE_KERNEL": "avx2_w8a16", "FP8SERVE_DISABLED_KERNELS": "amx_w8a16"}
    ov = overrides_from("torch_w8a16", ["avx512_w8a16", "avx2_w8a16,amx_block_w8a16"], env)
    assert ov.forced == "torch_w8a16"
    assert ov.disabled == {"amx_w8a16", "avx512_w8a16", "avx2_w8a16", "amx_block_w8a16"}
    assert ov.to_dict() == {"forced": "torch_w8a16",
                            "disabled": sorted(ov.disabled), "forced_bf16": None,
                            "rows_by_role": None}
    assert overrides_from(None, None, env).forced == "avx2_w8a16"


# -- tables -------------------------------------------------------------------------


def test_table_infos_mark_support_forced_and_disabled() -> None:
    ov = KernelOverrides(forced="torch_w8a16", disabled=frozenset({"avx2_w8a16"}))
    infos = {t.name: t for t in table_infos(HW, ov, standard())}
    pt = infos["cpu/per_tensor"]
    assert pt.active
    got = {e.kernel_id: e for e in pt.entries}
    assert [e.kernel_id for e in pt.entries] == list(TABLE)
    assert not got["amx_w8a16"].supported and got["amx_w8a16"].reason == "no AMX"
    assert got["avx2_w8a16"].disabled and got["avx2_w8a16"].reason == DISABLED_REASON
    assert got["torch_w8a16"].supported and got["torch_w8a16"].forced


def test_first_choice_ignores_the_layer_shape_but_not_host_or_operator() -> None:
    cat = catalog(amx_w8a16=FakeKernel("amx_w8a16", unsupported="no AMX"),
                  avx512_w8a16=FakeKernel("avx512_w8a16", cannot="K=128 too small"),
                  avx2_w8a16=FakeKernel("avx2_w8a16"))
    sel = select_kernel(PT, HW, catalog=cat)
    assert (sel.first_choice, sel.kernel.id) == ("avx512_w8a16", "avx2_w8a16")  # a fallback
    assert select_kernel(PT, HW, catalog=standard()).first_choice == "avx2_w8a16"  # none
    off = KernelOverrides(disabled=frozenset({"avx2_w8a16"}))
    assert select_kernel(PT, HW, off, catalog=standard()).first_choice == "torch_w8a16"
    forced = KernelOverrides(forced="avx512_w8a16")
    sel = select_kernel(PT, HW, forced, catalog=standard())
    assert (sel.first_choice, sel.kernel.id) == ("avx512_w8a16", "avx2_w8a16")
