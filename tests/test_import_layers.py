"""The import layers, read from the source (ast, nothing is imported): bench/ imports engine
and service, and neither imports bench; no import circle among bench's modules; no circle
among the top-level packages. Every import counts: module level, inside a function, under
TYPE_CHECKING."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("ext", "engine", "service", "bench", "cli")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def all_modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in sorted((ROOT / pkg).rglob("*.py"))}


def imported_names(name: str, path: Path) -> set[str]:
    """Every dotted name ``path`` imports (``from a import b`` gives a and a.b), relative
    imports resolved against ``name``."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out |= {base} | {f"{base}.{a.name}" for a in node.names}
    return out


def import_graph(modules: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the project modules it imports (a name that is not a module counts as the
    nearest enclosing module: ``from a.b import f`` -> a.b)."""
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        targets = set()
        for imp in imported_names(name, path):
            while imp and imp not in modules:
                imp = imp.rpartition(".")[0]
            if imp and imp != name:
                targets.add(imp)
        graph[name] = targets
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


@pytest.fixture(scope="module")
def graph() -> dict[str, set[str]]:
    return import_graph(all_modules())


def top(name: str) -> str:
    return name.split(".")[0]


def test_engine_and_service_never_import_bench(graph):
    bad = sorted(f"{m} -> {t}" for m, ts in graph.items() for t in ts
                 if top(m) in ("ext", "engine", "service") and top(t) in ("bench", "cli"))
    assert not bad, "imports from below into bench/cli:\n" + "\n".join(bad)


def test_bench_is_used_only_by_the_command_line(graph):
    users = {top(m) for m, ts in graph.items() for t in ts if top(t) == "bench"}
    assert users <= {"bench", "cli"}, users
    assert "bench" in {top(t) for t in graph["cli.bench"]}, "cli/bench.py gathers bench/"


def test_no_circle_among_bench_modules(graph):
    sub = {m: {t for t in ts if top(t) == "bench"} for m, ts in graph.items() if top(m) == "bench"}
    assert len(sub) > 30, sorted(sub)
    assert find_cycle(sub) is None, " -> ".join(find_cycle(sub))


def test_no_circle_among_bench_folders(graph):
    def folder(m: str) -> str:
        return ".".join(m.split(".")[:2])

    folders: dict[str, set[str]] = {}
    for m, ts in graph.items():
        if top(m) == "bench":
            folders.setdefault(folder(m), set()).update(
                folder(t) for t in ts if top(t) == "bench" and folder(t) != folder(m))
    assert find_cycle(folders) is None, " -> ".join(find_cycle(folders))


def test_no_circle_among_top_level_packages(graph):
    """cli -> bench -> service -> engine, one way. ext and engine import each other today
    (ext's build and ISA choice read engine.hardware; engine's kernels call ext), so they
    count as one layer here."""
    def layer(m: str) -> str:
        return "engine" if top(m) == "ext" else top(m)

    layers: dict[str, set[str]] = {layer(p): set() for p in PACKAGES}
    for m, ts in graph.items():
        layers[layer(m)].update(layer(t) for t in ts if layer(t) != layer(m))
    assert find_cycle(layers) is None, " -> ".join(find_cycle(layers))
    assert "engine" in layers["bench"] and "bench" in layers["cli"]


def test_the_checks_catch_what_they_claim(tmp_path):
    """The graph reads function-level, TYPE_CHECKING and relative imports, and a circle
    is reported."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.b import X\n")
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    from . import c\n")
    (tmp_path / "pkg" / "c.py").write_text("from .a import Y\n")
    mods = {n: tmp_path / "pkg" / f"{n.split('.')[-1]}.py" for n in ("pkg.a", "pkg.b", "pkg.c")}
    g = {n: {t for t in imported_names(n, p) if t in mods} for n, p in mods.items()}
    assert g == {"pkg.a": {"pkg.b"}, "pkg.b": {"pkg.c"}, "pkg.c": {"pkg.a"}}
    assert sorted(find_cycle(g)[:-1]) == ["pkg.a", "pkg.b", "pkg.c"]
    assert find_cycle({"x": {"y"}, "y": set()}) is None
