"""``python -m cli.docgen [--check]``: regenerate docs/configuration.md and the generated
regions of docs/api.md, or (``--check``) exit 1 when either differs from the code."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from cli.docgen import API, CONFIGURATION, ROOT
from cli.docgen.api_doc import render_api
from cli.docgen.config_doc import render_configuration


def expected() -> dict[Path, str]:
    """Each generated file's text as the code says it should be."""
    return {CONFIGURATION: render_configuration(),
            API: render_api(API.read_text(encoding="utf-8"))}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cli.docgen", description=__doc__)
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when a generated file is stale")
    args = parser.parse_args(argv)
    stale = []
    for path, text in expected().items():
        if path.exists() and path.read_text(encoding="utf-8") == text:
            continue
        stale.append(path.relative_to(ROOT))
        if not args.check:
            path.write_text(text, encoding="utf-8")
    verb = "stale (run python -m cli.docgen)" if args.check else "written"
    for path in stale:
        print(f"{path}: {verb}")
    return 1 if args.check and stale else 0


if __name__ == "__main__":
    sys.exit(main())
