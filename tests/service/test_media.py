"""service/media.py: the media policy on its own (data URLs, host allowlist matching,
file paths, size caps), and the encoded-image cache's LRU bound."""

from __future__ import annotations

import base64
import gzip
import os
import time
from pathlib import Path

import pytest
import torch

from engine.vision.image_cache import ImageCache, image_key
from engine.vision.preprocess import ImageGrid
from service.errors import APIError
from service.media import (
    MediaPolicy,
    _host_allowed,
    _TooBig,
    decode_data_url,
    load_media,
    read_beneath,
)


def test_data_urls() -> None:
    raw = b"\x89PNG fake bytes"
    b64 = base64.b64encode(raw).decode()
    assert decode_data_url(f"data:image/png;base64,{b64}", "p", 100) == raw
    spaced = b64[:4] + "\n " + b64[4:]
    assert decode_data_url(f"data:image/jpeg;base64,{spaced}", "p", 100) == raw
    with pytest.raises(APIError, match="not an image"):
        decode_data_url(f"data:text/plain;base64,{b64}", "p", 100)
    with pytest.raises(APIError, match="over the limit of 4 bytes"):
        decode_data_url(f"data:image/png;base64,{b64}", "p", 4)
    with pytest.raises(APIError, match="not valid base64") as exc:
        decode_data_url("data:image/png;base64,abc", "messages[0].content[1]", 100)
    assert exc.value.status == 400 and exc.value.param == "messages[0].content[1]"


def test_data_url_scheme_and_media_type_in_any_case() -> None:
    """RFC 3986 3.1 (schemes) and RFC 2045 5.1 (media types): case-insensitive."""
    raw = b"\x89PNG fake bytes"
    b64 = base64.b64encode(raw).decode()
    for url in (f"data:IMAGE/PNG;base64,{b64}", f"DATA:Image/Jpeg;BASE64,{b64}"):
        assert load_media(url, "p", MediaPolicy()) == raw
    with pytest.raises(APIError, match="not an image"):
        load_media(f"data:TEXT/plain;base64,{b64}", "p", MediaPolicy())


@pytest.mark.parametrize("policy,url", [
    (MediaPolicy(), "http://[::1/a.png"),  # refused before the host is read
    (MediaPolicy(), "https://[not-ip]/x.png"),
    (MediaPolicy(allowed_domains=("localhost",), fetch_timeout=2), "https://[not-ip]/x.png"),
    (MediaPolicy(allowed_domains=("localhost",), fetch_timeout=2),
     "http://localhost:port/a.png"),  # httpx.InvalidURL, no HTTPError
    (MediaPolicy(allowed_domains=("localhost",), fetch_timeout=2),
     "http://localhost:99999/a.png"),  # a port out of range
    (MediaPolicy(allowed_domains=("localhost",), fetch_timeout=2),
     "http://localhost/a.png\n"),  # a control character
    (MediaPolicy(allowed_domains=("localhost",), fetch_timeout=2),
     "http://localhost/" + "a" * 70000),  # over httpx's URL length
    (MediaPolicy(local_root=Path("/tmp")), "file://[x]/etc/passwd"),
    (MediaPolicy(local_root=Path("/tmp")), "file:///tmp/a%00b.png"),  # a NUL in the path
])
def test_malformed_urls_are_400s_naming_the_part(policy: MediaPolicy, url: str) -> None:
    """Each was a 500 (a ValueError, httpx.InvalidURL or an exception group escaping)."""
    with pytest.raises(APIError) as exc:
        load_media(url, "messages[0].content[1]", policy)
    assert exc.value.status == 400 and exc.value.param == "messages[0].content[1]"


@pytest.mark.parametrize("host,ok", [
    ("example.com", True), ("cdn.example.com", True), ("EXAMPLE.com.", True),
    ("badexample.com", False), ("example.com.evil.org", False), ("", False),
])
def test_host_allowlist(host: str, ok: bool) -> None:
    assert _host_allowed(host, ("example.com",)) is ok


def test_file_policy(tmp_path: Path) -> None:
    (tmp_path / "ok.png").write_bytes(b"12345")
    (tmp_path / "big.png").write_bytes(b"x" * 50)
    (tmp_path / "link.png").symlink_to("/etc/hostname")
    policy = MediaPolicy(local_root=tmp_path, max_bytes=10)
    assert load_media(f"file://{tmp_path / 'ok.png'}", "p", policy) == b"12345"
    os.mkfifo(tmp_path / "pipe.png")  # its read would block the worker thread for good
    for name, msg in (("big.png", "over the limit"), ("link.png", "outside"),
                      ("missing.png", "cannot read"), ("../x.png", "outside"),
                      ("pipe.png", "not a regular file")):
        with pytest.raises(APIError, match=msg):
            load_media(f"file://{tmp_path / name}", "p", policy)
    with pytest.raises(APIError, match="non-empty string"):
        load_media(None, "p", policy)


def test_a_path_swapped_for_a_link_after_the_check_is_not_followed(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    for d in (root / "sub", outside, root):
        (d / "a.png").write_bytes(b"12345")
    checked = [(root / "sub" / "a.png").resolve(), (root / "a.png").resolve()]
    assert [read_beneath(root.resolve(), p, 10) for p in checked] == [b"12345"] * 2
    # each path passed the policy's check; now a directory and a file become links out
    (root / "sub").rename(root / "old")
    (root / "sub").symlink_to(outside)
    (root / "a.png").unlink()
    (root / "a.png").symlink_to(outside / "a.png")
    for p in checked:
        with pytest.raises(OSError):
            read_beneath(root.resolve(), p, 10)
    assert read_beneath(root.resolve(), (root / "old" / "a.png").resolve(), 5) == b"12345"
    with pytest.raises(_TooBig):
        read_beneath(root.resolve(), (root / "old" / "a.png").resolve(), 4)


def test_image_cache_is_lru_and_bounded() -> None:
    grid = ImageGrid(1, 2)
    t = torch.zeros(2, 8, dtype=torch.bfloat16)  # 32 bytes
    cache = ImageCache(max_bytes=64)
    keys = [image_key(bytes([i]), grid) for i in range(3)]
    assert len(set(keys)) == 3 and image_key(b"\x00", ImageGrid(2, 1)) != keys[0]
    cache.put(keys[0], t)
    cache.put(keys[1], t)
    assert cache.get(keys[0]) is t  # 0 is now the most recent
    cache.put(keys[2], t)
    assert cache.get(keys[1]) is None and cache.get(keys[0]) is t and len(cache) == 2
    cache.put(b"big", torch.zeros(100, 8, dtype=torch.bfloat16))  # over the bound: skipped
    assert cache.get(b"big") is None and cache.nbytes == 64


@pytest.fixture()
def local_http():
    """A real HTTP server on 127.0.0.1: /img (200, bytes), /big, /moved (302), /missing."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    body = b"\x89PNG served bytes" * 4

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 - http.server's name
            if self.path in ("/drip", "/drip-headers"):  # a byte at a time, each well
                head = (b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nX-Pad: "  # within a
                        + b"x" * 60 + b"\r\n\r\n")  # read timeout: the headers, or the body
                if self.path == "/drip":
                    self.wfile.write(head)
                    head = b""
                try:
                    for byte in head + b"x" * 100:
                        self.wfile.write(bytes([byte]))
                        self.wfile.flush()
                        time.sleep(0.1)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client cut the fetch at its timeout, as the test wants
                return
            routes = {"/img": (200, body), "/big": (200, body * 100),
                      "/moved": (302, b""), "/missing": (404, b""),
                      "/gzip": (200, gzip.compress(b"\0" * 2**22, mtime=0))}
            status, data = routes.get(self.path, (404, b""))
            self.send_response(status)
            if status == 302:
                self.send_header("Location", "/img")
            if self.path == "/gzip":  # whatever the client accepts: 4 MiB in 4 KiB
                self.send_header("Content-Encoding", "gzip")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}", body
    server.shutdown()


def test_http_fetch_from_an_allowed_host(local_http) -> None:
    base, body = local_http
    policy = MediaPolicy(allowed_domains=("127.0.0.1",), max_bytes=len(body) * 10)
    assert load_media(base + "/img", "p", policy) == body
    with pytest.raises(APIError, match="over the limit"):
        load_media(base + "/big", "p", policy)
    with pytest.raises(APIError, match="HTTP 302"):  # redirects are not followed
        load_media(base + "/moved", "p", policy)
    with pytest.raises(APIError, match="HTTP 404"):
        load_media(base + "/missing", "p", policy)
    with pytest.raises(APIError, match="not in --allowed-media-domains"):
        load_media(base + "/img", "p", MediaPolicy(allowed_domains=("example.com",)))


def test_a_fetch_is_not_decompressed(local_http) -> None:
    """The bytes a server sends are what the limit counts: a Content-Encoding is not
    undone (a gzip or deflate chunk of 64 KiB became up to 64 MiB at once before the limit
    was checked); images are compressed already."""
    base, _ = local_http
    served = gzip.compress(b"\0" * 2**22, mtime=0)  # no timestamp: the same bytes
    policy = MediaPolicy(allowed_domains=("127.0.0.1",), max_bytes=len(served))
    assert load_media(base + "/gzip", "p", policy) == served


def test_a_fetch_that_drips_ends_at_the_fetch_timeout(local_http) -> None:
    """--media-fetch-timeout bounds the whole fetch, not each read: a server sending its
    headers or its body a byte every 0.1 s is cut at 0.5 s."""
    base, _ = local_http
    policy = MediaPolicy(allowed_domains=("127.0.0.1",), fetch_timeout=0.5)
    for path in ("/drip", "/drip-headers"):
        start = time.monotonic()
        with pytest.raises(APIError, match="timed out after 0.5 s"):
            load_media(base + path, "p", policy)
        assert time.monotonic() - start < 1.5, path
