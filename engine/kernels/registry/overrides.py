"""The operator's kernel overrides (FP8SERVE_KERNEL / --kernel forces one FP8 and one bf16
kernel, FP8SERVE_DISABLED_KERNELS / --disable-kernel disables any; --rows-by-role says
whether a layer's generated rows may run another kernel than its prompt rows): the frozen
:class:`KernelOverrides` and how it is read from flags and the environment, every unknown
kernel id an error naming where it was given."""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from engine.kernels.registry.tables import BF16_KERNEL_IDS, ENV_DISABLED, ENV_FORCED, KNOWN_IDS


def _split_ids(ids: str | Iterable[str] | None) -> frozenset[str]:
    if ids is None:
        return frozenset()
    items = [ids] if isinstance(ids, str) else list(ids)
    return frozenset(k.strip() for item in items for k in item.split(",") if k.strip())


@dataclass(frozen=True, slots=True)
class KernelOverrides:
    forced: str | None = None  # FP8SERVE_KERNEL / --kernel: an FP8 table's kernel
    disabled: frozenset[str] = frozenset()  # FP8SERVE_DISABLED_KERNELS / --disable-kernel
    forced_bf16: str | None = None  # the same flag's bf16 kernel (BF16_KERNEL_IDS)
    # whether generated rows may run the layer's generated_rows_kernel (AMX hosts: decode
    # on avx512_w8a16): True / False, or None where the engine has not decided yet (the
    # runner resolves it from EngineConfig.rows_by_role_on; a host's tables show the split
    # a runner may make)
    rows_by_role: bool | None = None

    def __post_init__(self) -> None:
        unknown = ({self.forced} if self.forced else set()) | set(self.disabled)
        unknown -= set(KNOWN_IDS)
        if unknown:
            raise ValueError(
                f"unknown kernel id(s) {sorted(unknown)}; known: {sorted(KNOWN_IDS)}"
            )
        if self.forced in BF16_KERNEL_IDS or (
                self.forced_bf16 is not None and self.forced_bf16 not in BF16_KERNEL_IDS):
            raise ValueError(f"forced {self.forced!r} / forced_bf16 {self.forced_bf16!r}: "
                             f"bf16 kernels ({', '.join(BF16_KERNEL_IDS)}) are forced_bf16")

    def forces(self, kernel_id: str) -> bool:
        return kernel_id in (self.forced, self.forced_bf16)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> KernelOverrides:
        return overrides_from(None, None, env)

    def to_dict(self) -> dict[str, object]:
        return {"forced": self.forced, "disabled": sorted(self.disabled),
                "forced_bf16": self.forced_bf16, "rows_by_role": self.rows_by_role}


NO_OVERRIDES = KernelOverrides()


def overrides_from(kernel: str | None, disabled: str | Iterable[str] | None,
                   env: Mapping[str, str] | None = None) -> KernelOverrides:
    """Operator overrides from CLI/config values and the environment.

    ``kernel`` (``--kernel``) replaces FP8SERVE_KERNEL when given: one id, or two
    comma-separated, at most one of an FP8 table and one bf16 kernel (BF16_KERNEL_IDS).
    ``disabled`` (``--disable-kernel``, comma lists allowed) adds to
    FP8SERVE_DISABLED_KERNELS. Raises ValueError naming any unknown kernel id and where it
    was given (the flag or the environment variable)."""
    env = os.environ if env is None else env
    flag_forced = (kernel or "").strip()
    env_forced = (env.get(ENV_FORCED) or "").strip()
    source = f"--kernel {flag_forced}" if flag_forced else f"{ENV_FORCED}={env_forced}"
    fp8, bf16 = _split_forced(flag_forced or env_forced, source)
    env_off, flag_off = _split_ids(env.get(ENV_DISABLED)), _split_ids(disabled)
    _check_known(env_off, f"{ENV_DISABLED}={env.get(ENV_DISABLED)}")
    _check_known(flag_off, f"--disable-kernel {','.join(sorted(flag_off))}")
    return KernelOverrides(fp8, env_off | flag_off, bf16)


def _split_forced(value: str, source: str) -> tuple[str | None, str | None]:
    """(the FP8 kernel, the bf16 kernel) a --kernel / FP8SERVE_KERNEL value forces."""
    ids = [k.strip() for k in value.split(",") if k.strip()]
    _check_known(set(ids), source)
    fp8 = [k for k in ids if k not in BF16_KERNEL_IDS]
    bf16 = [k for k in ids if k in BF16_KERNEL_IDS]
    if len(fp8) > 1 or len(bf16) > 1:
        raise ValueError(f"{source}: at most one FP8 kernel and one bf16 kernel "
                         f"({', '.join(BF16_KERNEL_IDS)}) may be forced")
    return (fp8[0] if fp8 else None), (bf16[0] if bf16 else None)


def _check_known(ids: Iterable[str], source: str) -> None:
    unknown = sorted(set(ids) - set(KNOWN_IDS))
    if unknown:
        raise ValueError(f"{source}: unknown kernel id(s) {', '.join(unknown)}; known: "
                         f"{', '.join(sorted(KNOWN_IDS))}")
