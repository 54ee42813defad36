"""An unknown kernel id names where it was given: --kernel, --disable-kernel,
FP8SERVE_KERNEL or FP8SERVE_DISABLED_KERNELS (the error named none of them)."""

from __future__ import annotations

import pytest

import cli.serve
from cli.main import main
from engine.kernels.registry import KernelOverrides, overrides_from


@pytest.mark.parametrize(("kernel", "disabled", "env", "named"), [
    ("bogus", None, {}, "--kernel bogus: unknown kernel id(s) bogus; known: "),
    (None, ["avx2_w8a16,bogus"], {}, "--disable-kernel avx2_w8a16,bogus: unknown kernel "
                                     "id(s) bogus"),
    (None, None, {"FP8SERVE_KERNEL": "bogus"}, "FP8SERVE_KERNEL=bogus: unknown kernel id"),
    (None, None, {"FP8SERVE_DISABLED_KERNELS": "nope"},
     "FP8SERVE_DISABLED_KERNELS=nope: unknown kernel id(s) nope"),
])
def test_unknown_kernel_ids_name_their_source(kernel, disabled, env, named) -> None:
    with pytest.raises(ValueError) as exc:
        overrides_from(kernel, disabled, env)
    assert str(exc.value).startswith(named)


def test_known_ids_combine_as_before() -> None:
    ov = overrides_from(None, ["avx2_w8a16"], {"FP8SERVE_KERNEL": "torch_w8a16",
                                               "FP8SERVE_DISABLED_KERNELS": "amx_w8a16"})
    assert ov == KernelOverrides("torch_w8a16", frozenset({"avx2_w8a16", "amx_w8a16"}))


def test_serve_names_the_environment_variable(monkeypatch, tmp_path, capsys) -> None:
    # the value came from the environment: the error named neither it nor any flag
    monkeypatch.setenv("FP8SERVE_KERNEL", "avx1024_w8a16")
    monkeypatch.setattr(cli.serve, "_load_backend", _no_load)
    assert main(["serve", "--model", str(tmp_path), "--threads", "1", "--port", "0"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("fp8serve: error: FP8SERVE_KERNEL=avx1024_w8a16: unknown kernel")


def _no_load(settings):
    raise AssertionError("the model was loaded")
