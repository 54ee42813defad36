"""The image-input flags reach Settings: --limit-mm-per-prompt (vLLM's spelling),
--max-image-size, --allowed-media-domains, --media-fetch-timeout,
--allowed-local-media-path, --max-media-bytes, --image-cache-mib, and their env vars."""

from __future__ import annotations

from pathlib import Path

import pytest

from cli.main import CliError, build_parser
from cli.serve import settings_from_args


def _settings(argv: list[str]):  # type: ignore[no-untyped-def]
    return settings_from_args(build_parser().parse_args(["serve", *argv]))


def test_defaults(monkeypatch) -> None:
    for name in ("LIMIT_MM_PER_PROMPT", "ALLOWED_MEDIA_DOMAINS", "MAX_IMAGE_SIZE"):
        monkeypatch.delenv(f"FP8SERVE_{name}", raising=False)
    s = _settings([])
    assert s.limit_mm_per_prompt == 4 and s.max_image_size is None
    assert s.allowed_media_domains == () and s.media_fetch_timeout == 5.0
    assert s.allowed_local_media_path is None and s.max_media_bytes == 20 * 2**20


def test_flags(tmp_path: Path) -> None:
    s = _settings(["--limit-mm-per-prompt", "image=0", "--max-image-size", "512",
                   "--allowed-media-domains", "example.com", "cdn.example.org",
                   "--media-fetch-timeout", "2.5", "--allowed-local-media-path", str(tmp_path),
                   "--max-media-bytes", "1000", "--image-cache-mib", "64"])
    assert s.limit_mm_per_prompt == 0 and s.max_image_size == 512
    assert s.allowed_media_domains == ("example.com", "cdn.example.org")
    assert s.media_fetch_timeout == 2.5 and s.allowed_local_media_path == tmp_path
    assert s.max_media_bytes == 1000 and s.image_cache_mib == 64
    assert _settings(["--limit-mm-per-prompt", '{"image": 3}']).limit_mm_per_prompt == 3


def test_env(monkeypatch) -> None:
    monkeypatch.setenv("FP8SERVE_ALLOWED_MEDIA_DOMAINS", "a.com, b.org")
    monkeypatch.setenv("FP8SERVE_LIMIT_MM_PER_PROMPT", "1")
    s = _settings([])
    assert s.allowed_media_domains == ("a.com", "b.org") and s.limit_mm_per_prompt == 1
    for text, n in (("image=0", 0), ('{"image": 2}', 2)):  # the flag's forms too
        monkeypatch.setenv("FP8SERVE_LIMIT_MM_PER_PROMPT", text)
        assert _settings([]).limit_mm_per_prompt == n
    monkeypatch.setenv("FP8SERVE_LIMIT_MM_PER_PROMPT", "video=1")
    with pytest.raises(CliError, match="only image"):
        _settings([])


@pytest.mark.parametrize("bad", ["video=1", "image=-1", "image=x", "3"])
def test_bad_limit(bad: str, capsys) -> None:
    with pytest.raises(SystemExit):
        _settings(["--limit-mm-per-prompt", bad])
    assert "--limit-mm-per-prompt" in capsys.readouterr().err
