"""Image input through the real app, engine and vision tower of a tiny multimodal
checkpoint (tekken tokenizer): data URLs, the fetch policy flags, usage, the encoded-image
cache, metrics, /v1/models and /kernels, and every 400."""

from __future__ import annotations

import base64
import io
import socket
import threading
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from service.app import create_app
from service.settings import Settings
from tests.engine.vision.support import write_pair


def png(w: int, h: int, seed: int = 0, mode: str = "RGB") -> bytes:
    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 256, (h, w, 4 if mode == "RGBA" else 3), dtype=np.uint8)
    buf = io.BytesIO()
    Image.fromarray(arr, mode).save(buf, "PNG")
    return buf.getvalue()


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def part(url: str) -> dict:
    return {"type": "image_url", "image_url": {"url": url}}


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_pair(tmp_path_factory.mktemp("api-vision"))[0]


def _client(model: Path, **kw: object) -> TestClient:
    cfg = Settings(model=model, max_model_len=256, kv_cache_gib=0.02, max_num_seqs=4, **kw)
    return TestClient(create_app(cfg))


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("media")
    (d / "a.png").write_bytes(png(50, 40, seed=3))
    return d


@pytest.fixture(scope="module")
def client(model: Path, root: Path):
    with _client(model, limit_mm_per_prompt=2, allowed_local_media_path=root,
                 allowed_media_domains=("127.0.0.1",), media_fetch_timeout=0.5) as c:
        yield c


def chat(client: TestClient, content: object, role: str = "user", **kw: object):
    messages = [{"role": role, "content": content}]
    if role != "user":
        messages.append({"role": "user", "content": "hi"})
    body = {"messages": messages, "max_tokens": 3, "temperature": 0, **kw}
    return client.post("/v1/chat/completions", json=body)


def test_data_url_image_counts_its_tokens(client) -> None:
    text = chat(client, "describe")
    img = chat(client, [{"type": "text", "text": "describe"}, part(data_url(png(112, 84)))])
    assert text.status_code == 200 and img.status_code == 200, img.text
    grid_tokens = 3 * (4 + 1)  # 84 x 112 -> 3 rows of 4 [IMG] + a break/end each
    assert img.json()["usage"]["prompt_tokens"] == text.json()["usage"]["prompt_tokens"] + (
        grid_tokens)
    # /tokenize counts what the chat request's prompt holds (it refused image parts)
    tok = client.post("/tokenize", json={"messages": [{"role": "user", "content": [
        {"type": "text", "text": "describe"}, part(data_url(png(112, 84)))]}]})
    assert tok.status_code == 200, tok.text
    assert tok.json()["count"] == img.json()["usage"]["prompt_tokens"]


def test_same_image_is_encoded_once_and_reuses_kv(client) -> None:
    content = [part(data_url(png(112, 112, seed=9))), {"type": "text", "text": "and?"}]
    first = chat(client, content)
    second = chat(client, content)
    other = chat(client, [part(data_url(png(112, 112, seed=10))),
                          {"type": "text", "text": "and?"}])
    assert first.status_code == second.status_code == other.status_code == 200
    cached = [r.json()["usage"].get("prompt_tokens_details", {}).get("cached_tokens", 0)
              for r in (first, second, other)]
    assert cached[1] > cached[2]  # the other image's blocks never match
    metrics = client.get("/metrics").text
    assert "fp8serve_image_cache_hits_total" in metrics
    hits = [ln for ln in metrics.splitlines() if ln.startswith("fp8serve_image_cache_hits")]
    assert float(hits[0].split()[-1]) >= 1
    assert "fp8serve_image_encode_seconds_bucket" in metrics
    assert "fp8serve_images_encoded_total" in metrics and "fp8serve_image_tokens_total" in metrics


def test_rgba_and_file_urls(client, root: Path) -> None:
    assert chat(client, [part(data_url(png(30, 30, mode="RGBA")))]).status_code == 200
    assert chat(client, [part(f"file://{root / 'a.png'}")]).status_code == 200


def test_models_and_kernels_say_images_are_served(client) -> None:
    card = client.get("/v1/models").json()["data"][0]
    assert card["input_modalities"] == ["text", "image"]
    vision = client.get("/kernels").json()["vision"]
    assert vision["images"] is True and vision["max_images_per_prompt"] == 2
    assert vision["max_image_size"] == 112


class _Silent:
    """A TCP server that accepts and never answers (fetch timeouts)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                return


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


BAD = {
    "not_base64": ([part("data:image/png;base64,@@@not-base64@@@")], "not valid base64"),
    "not_a_data_url_form": ([part("data:image/png,rawbytes")], "base64 only"),
    "undecodable": ([part(data_url(b"definitely not an image"))], "cannot decode image"),
    "scheme": ([part("ftp://example.com/a.png")], "scheme 'ftp' not supported"),
    "host_not_allowed": ([part("http://example.com/a.png")], "not in --allowed-media-domains"),
    "too_many": ([part(data_url(png(28, 28, s))) for s in range(3)], "at most 2"),
    "file_outside": ([part("file:///etc/hostname")], "outside --allowed-local-media-path"),
}


def test_typed_img_text_is_text(client) -> None:
    """mistral-common encodes "[IMG]" in user text as text, never as the image token: it
    cannot shift the image layout (tokenizers that do parse it get a 400 instead)."""
    r = chat(client, [{"type": "text", "text": "[IMG]"}, part(data_url(png(28, 28)))])
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_images_are_400(client, case: str) -> None:
    content, message = BAD[case]
    r = chat(client, content)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert message in err["message"] and err["param"].startswith("messages")


def test_fetch_failures_are_400(client) -> None:
    r = chat(client, [part(f"http://127.0.0.1:{_closed_port()}/a.png")])
    assert r.status_code == 400 and "failed" in r.json()["error"]["message"]
    silent = _Silent()
    r = chat(client, [part(f"http://127.0.0.1:{silent.port}/a.png")])
    assert r.status_code == 400 and "timed out after 0.5 s" in r.json()["error"]["message"]


@pytest.mark.parametrize("role", ["system", "assistant"])
def test_images_outside_user_messages_are_400(client, role: str) -> None:
    r = chat(client, [{"type": "text", "text": "x"}, part(data_url(png(28, 28)))], role=role)
    assert r.status_code == 400
    assert "user messages only" in r.json()["error"]["message"]


def test_truncating_a_prompt_with_an_image_is_a_400(client) -> None:
    content = [{"type": "text", "text": "describe"}, part(data_url(png(28, 28)))]
    whole = chat(client, content)
    n = whole.json()["usage"]["prompt_tokens"]
    # a bound the prompt does not reach cuts nothing: served as without it
    assert chat(client, content, truncate_prompt_tokens=n).json()["choices"] == (
        whole.json()["choices"])
    r = chat(client, content, truncate_prompt_tokens=n - 1)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "truncate_prompt_tokens" and "images" in err["message"]


def test_completions_stay_text_only(client) -> None:
    r = client.post("/v1/completions", json={"prompt": "hello", "max_tokens": 2})
    assert r.status_code == 200


def test_limit_zero_keeps_text_only_serving(model: Path) -> None:
    with _client(model, limit_mm_per_prompt=0) as c:
        r = chat(c, [part(data_url(png(28, 28)))])
        assert r.status_code == 400 and "limit-mm-per-prompt image=0" in r.text
        assert c.get("/kernels").json()["vision"]["images"] is False
        assert c.get("/v1/models").json()["data"][0]["input_modalities"] == ["text"]
        assert chat(c, "text works").status_code == 200


def test_text_only_checkpoint_refuses_images(tiny_checkpoint) -> None:
    cfg = Settings(model=tiny_checkpoint(tokenizer=True), max_model_len=256,
                   kv_cache_gib=0.02)
    with TestClient(create_app(cfg)) as c:
        r = chat(c, [part(data_url(png(28, 28)))])
        assert r.status_code == 400 and "no vision tower" in r.json()["error"]["message"]


def test_http_refused_without_the_flag(model: Path) -> None:
    with _client(model) as c:
        r = chat(c, [part("https://example.com/a.png")])
        assert r.status_code == 400 and "--allowed-media-domains" in r.text
        r = chat(c, [part("file:///tmp/a.png")])
        assert r.status_code == 400 and "--allowed-local-media-path" in r.text


def _prompt_of(state, content: list) -> tuple[list[int], tuple]:  # type: ignore[no-untyped-def]
    from service.images import encode_chat_prompt
    from service.schemas import ChatMessage

    return encode_chat_prompt(state, [ChatMessage(role="user", content=content)])


def test_prompt_layout_and_features_in_place(client) -> None:
    from engine.vision.prompt_image import check_layout

    state = client.app.state.serving
    content = [{"type": "text", "text": "look"}, part(data_url(png(56, 84))),
               {"type": "text", "text": "and"}, part(data_url(png(28, 28, seed=2)))]
    ids, images = _prompt_of(state, content)
    assert [(i.grid.rows, i.grid.cols) for i in images] == [(3, 2), (1, 1)]
    check_layout(images, ids, 10)
    first = images[0]
    assert ids[first.start:first.end] == [10, 10, 12, 10, 10, 12, 10, 10, 13]
    assert ids[images[1].start:images[1].end] == [10, 13]
    assert images[0].features.shape == (6, 256)


def test_jinja_template_path_gives_the_same_prompt(client, tmp_path: Path) -> None:
    """tokenizer.json + chat_template.jinja (the HF pair) lays images out as tekken does,
    "[IMG]" typed as text included (text there too, not a second image's place)."""
    from engine.synth import write_checkpoint
    from tests.engine.vision.support import vision_spec

    write_checkpoint(tmp_path, vision_spec(tokenizer="hf"))
    for text in ("look", "look [IMG] here[IMG_END]"):
        content = [{"type": "text", "text": text}, part(data_url(png(56, 84)))]
        with _client(tmp_path) as hf_client:
            hf_ids, _ = _prompt_of(hf_client.app.state.serving, content)
        tekken_ids, _ = _prompt_of(client.app.state.serving, content)
        assert hf_ids == tekken_ids
