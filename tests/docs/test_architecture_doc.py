"""docs/architecture.md's package table names every module of engine/, service/ and cli/
(a sub-package once, as a whole): a module added without its line fails here."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_package_table_names_every_module_and_sub_package():
    doc = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    missing = []
    for top in ("engine", "service", "cli"):
        for path in sorted((ROOT / top).iterdir()):
            if path.is_file() and path.suffix == ".py" and not path.name.startswith("__"):
                row = f"| `{top}/{path.name}` |"
            elif path.is_dir() and (path / "__init__.py").exists():
                row = f"| `{top}/{path.name}/` |"
            else:
                continue
            if row not in doc:
                missing.append(row)
    assert not missing, f"not in docs/architecture.md's package table: {missing}"
