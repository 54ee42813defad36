"""The generated parts of docs/: ``docs/configuration.md`` (every ``fp8serve serve`` flag
and ``FP8SERVE_*`` variable, from the serve parser and service.settings.Settings) and the
field tables of ``docs/api.md`` (from the published OpenAPI schema, that is the request
models of service/schemas/ and service/translate/schemas/, and service/unsupported.py).

``python -m cli.docgen`` rewrites them; ``python -m cli.docgen --check`` exits 1 naming each
stale file. tests/docs/ runs the check, so a flag or a request field added without
regenerating fails the tests.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CONFIGURATION = ROOT / "docs" / "configuration.md"
API = ROOT / "docs" / "api.md"


def cell(text: object) -> str:
    """One Markdown table cell: pipes escaped, line breaks folded."""
    return " ".join(str(text).split()).replace("|", "\\|")


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return lines
