"""bench/serve/client.sse_data: the benchmark client's server-sent-event framing gives
the same payloads however the byte stream is cut into network reads."""

from __future__ import annotations

import pytest

from bench.serve.client import sse_data

STREAM = (b'data: {"a": 1}\n\n'
          b': comment line\n\n'
          b'event: x\r\ndata: {"b": 2}\r\n\r\n'
          b'data:{"c": 3}\n\n'
          b'data: line one\ndata: line two\n\n'
          b'data: [DONE]\n\n')
EXPECTED = [b'{"a": 1}', b'{"b": 2}', b'{"c": 3}', b"line one\nline two", b"[DONE]"]


def _read(cuts: list[int]) -> tuple[list[bytes], bytes]:
    out, buffered, prev = [], b"", 0
    for cut in [*cuts, len(STREAM)]:
        payloads, buffered = sse_data(buffered, STREAM[prev:cut])
        out += payloads
        prev = cut
    return out, buffered


def test_whole_stream_in_one_read() -> None:
    assert _read([]) == (EXPECTED, b"")


def test_every_two_way_cut() -> None:
    for cut in range(1, len(STREAM)):
        assert _read([cut]) == (EXPECTED, b""), cut


def test_byte_by_byte() -> None:
    assert _read(list(range(1, len(STREAM)))) == (EXPECTED, b"")


def test_incomplete_event_is_carried() -> None:
    payloads, rest = sse_data(b"", b'data: {"a": 1}\n\ndata: {"b"')
    assert payloads == [b'{"a": 1}'] and rest == b'data: {"b"'
    assert sse_data(rest, b': 2}\n\n') == ([b'{"b": 2}'], b"")


def test_a_chunk_of_several_tokens_is_counted_by_the_usage_chunk() -> None:
    from bench.serve.client import RequestResult

    res = RequestResult(ok=True)
    res.take({"choices": [{"text": " a"}]}, 0.1)
    res.take({"choices": [{"text": " b c d"}]}, 0.3)  # a verified draft: three tokens
    res.take({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 4}}, 0.3)
    assert (res.output_tokens, res.events, res.ttft, res.text) == (4, 2, 0.1, " a b c d")
    assert res.itl == [pytest.approx(0.2)]
