"""Image URLs of chat content parts -> bytes, under the server's media policy (vLLM's
rules). Every refusal is an APIError(400) naming the content part.

- ``data:image/...;base64,...``: always accepted; the payload must be strict base64.
- ``http(s)://``: only with --allowed-media-domains (off by default); the host must be
  one of them or a subdomain; fetched with --media-fetch-timeout (5 s) and at most
  --max-media-bytes as sent (a Content-Encoding is not undone); redirects are not
  followed (a redirect could leave the allowlist).
- ``file://``: only under --allowed-local-media-path (resolved, symlinks included), then
  opened from that directory one component at a time without following links, so that
  a link swapped in after the check does not lead out of it.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import os
import re
import stat
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlparse

from service.errors import APIError

# the scheme, the media type and "base64" in any case (RFC 3986 3.1, RFC 2045 5.1)
DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*?);base64,"
                      r"(?P<data>.*)$", re.S | re.I)


@dataclass(frozen=True, slots=True)
class MediaPolicy:
    allowed_domains: tuple[str, ...] = ()  # empty: no http(s) fetches
    fetch_timeout: float = 5.0  # seconds, connect + read
    max_bytes: int = 20 * 2**20
    local_root: Path | None = None  # file:// only below this directory

    def __post_init__(self) -> None:
        if self.fetch_timeout <= 0 or self.max_bytes < 1:
            raise ValueError("fetch_timeout and max_bytes must be > 0")


def _bad(msg: str, param: str) -> APIError:
    return APIError(400, msg, param)


def decode_data_url(url: str, param: str, max_bytes: int) -> bytes:
    m = DATA_URL.match(url)
    if m is None:
        raise _bad("image data URL must be 'data:image/<type>;base64,<data>' (base64 only)",
                   param)
    if m.group("mime") and not m.group("mime").lower().startswith("image/"):
        raise _bad(f"data URL media type {m.group('mime')!r} is not an image", param)
    payload = re.sub(r"\s+", "", m.group("data"))
    if len(payload) * 3 // 4 > max_bytes:
        raise _bad(f"image data is over the limit of {max_bytes} bytes", param)
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise _bad("image data URL payload is not valid base64", param) from None


def _host_allowed(host: str, domains: tuple[str, ...]) -> bool:
    host = host.lower().rstrip(".")
    return any(host == d or host.endswith("." + d) for d in (x.lower() for x in domains))


def _parsed(url: str, param: str):  # noqa: ANN202 - urllib's ParseResult
    """urlparse's reading of ``url``, and its host; a malformed URL (an unclosed IPv6
    bracket, a bad port) is a 400 naming the part."""
    try:
        parts = urlparse(url)
        return parts, parts.hostname or ""
    except ValueError as exc:
        raise _bad(f"image URL is malformed: {exc}", param) from None


def fetch_http(url: str, param: str, policy: MediaPolicy) -> bytes:
    """The image at an allowed http(s) URL, fetched on a loop of this (worker) thread
    within ``policy.fetch_timeout`` in all: headers and body, however slowly they come
    (httpx's own timeout bounds each read only; a server dripping a byte per read held
    the thread as long as it dripped)."""
    import httpx

    if not policy.allowed_domains:
        raise _bad("http(s) image URLs are not allowed on this server (start it with "
                   "--allowed-media-domains); send a base64 data URL", param)
    _, host = _parsed(url, param)
    if not _host_allowed(host, policy.allowed_domains):
        raise _bad(f"image host {host!r} is not in --allowed-media-domains", param)
    try:
        return asyncio.run(asyncio.wait_for(_fetch(url, host, param, policy),
                                            policy.fetch_timeout))
    except (TimeoutError, httpx.TimeoutException):
        raise _bad(f"image fetch from {host} timed out after {policy.fetch_timeout:g} s",
                   param) from None
    except APIError:
        raise
    except Exception as exc:  # noqa: BLE001 - whatever the client's URL made fail
        # httpx.HTTPError, InvalidURL (a control character, an overlong URL: no
        # HTTPError), a bad port's ValueError or OSError, anyio's exception groups
        raise _bad(f"image fetch from {host} failed: {type(exc).__name__}", param) from None


async def _fetch(url: str, host: str, param: str, policy: MediaPolicy) -> bytes:
    import httpx

    async with httpx.AsyncClient(timeout=policy.fetch_timeout,
                                 follow_redirects=False) as client:
        # the bytes as sent: a gzip chunk of 64 KiB decoded to up to 64 MiB at once,
        # before the limit was checked (images are compressed already)
        async with client.stream("GET", url, headers={"Accept-Encoding": "identity"}) as resp:
            if resp.status_code != 200:
                raise _bad(f"image fetch failed: HTTP {resp.status_code} from {host}", param)
            data = bytearray()
            async for part in resp.aiter_raw():
                data += part
                if len(data) > policy.max_bytes:
                    raise _bad(f"image at {host} is over the limit of {policy.max_bytes} "
                               "bytes", param)
            return bytes(data)


def read_file(url: str, param: str, policy: MediaPolicy) -> bytes:
    if policy.local_root is None:
        raise _bad("file:// image URLs are not allowed on this server (start it with "
                   "--allowed-local-media-path)", param)
    name = unquote(_parsed(url, param)[0].path)
    if "\0" in name:  # no path holds one (resolve() raised ValueError: a 500)
        raise _bad("image path holds a NUL character", param)
    path = Path(name).resolve()
    root = policy.local_root.resolve()
    if not path.is_relative_to(root):
        raise _bad(f"image path is outside --allowed-local-media-path {root}", param)
    try:
        return read_beneath(root, path, policy.max_bytes)
    except _NotRegular:
        raise _bad("image path is not a regular file", param) from None
    except _TooBig:
        raise _bad(f"image file is over the limit of {policy.max_bytes} bytes", param) from None
    except OSError as exc:
        raise _bad(f"cannot read image file: {exc.strerror or exc}", param) from None


class _NotRegular(Exception):
    pass


class _TooBig(Exception):
    pass


def read_beneath(root: Path, path: Path, max_bytes: int) -> bytes:
    """The bytes of ``path`` (resolved, under ``root``), opened one component at a time
    from ``root`` without following a symlink, so that a path swapped for a link after the
    check above cannot lead outside ``root`` (OSError then); the file checked and read
    through its one descriptor (a FIFO or device would block the read; a file that grows
    is read to ``max_bytes`` + 1 only)."""
    parts = path.relative_to(root).parts
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for part in parts[:-1]:
            fd, parent = os.open(part, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW,
                                 dir_fd=fd), fd
            os.close(parent)
        if parts:
            fd, parent = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK,
                                 dir_fd=fd), fd
            os.close(parent)
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _NotRegular
        if info.st_size > max_bytes:
            raise _TooBig
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(max_bytes + 1)
        if len(data) > max_bytes:
            raise _TooBig
        return data
    finally:
        os.close(fd)


def load_media(url: object, param: str, policy: MediaPolicy) -> bytes:
    """The bytes an image URL names; APIError(400) for anything the policy refuses."""
    if not isinstance(url, str) or not url:
        raise _bad("image_url.url must be a non-empty string", param)
    scheme = url.split(":", 1)[0].lower() if ":" in url else ""
    if scheme == "data":
        return decode_data_url(url, param, policy.max_bytes)
    if scheme in ("http", "https"):
        return fetch_http(url, param, policy)
    if scheme == "file":
        return read_file(url, param, policy)
    raise _bad(f"image URL scheme {scheme or url[:16]!r} not supported (data, http, https, "
               "file)", param)
