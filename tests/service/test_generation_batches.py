"""Submission.batches groups what is already queued; stream_events writes one SSE string
per batch with the same events as one per output."""

import asyncio
from types import SimpleNamespace

from engine.request import FinishReason
from engine.stream import RequestOutput
from service.generation import Submission
from service.sse import NamedStream, stream_events, stream_named


def _queued(outputs) -> Submission:
    """A two-choice submission with ``outputs`` already queued (inside an event loop)."""
    state = SimpleNamespace(engine=SimpleNamespace(abort=lambda rid: None),
                            settings=SimpleNamespace(request_timeout=None, stream_interval=1),
                            dispatcher=None)
    sub = Submission(state, "t")
    sub.ids, sub.open = ["t-0", "t-1"], {0, 1}
    for item in outputs:
        sub.queue.put_nowait(item)
    return sub


def _submission(outputs):
    async def main():
        sub = _queued(outputs)
        return sub, [b async for b in sub.batches()]

    return asyncio.run(main())


def test_batches_group_queued_outputs_until_every_choice_finished():
    outs = [(0, RequestOutput("a", text="x")), (1, RequestOutput("b", text="y")),
            (0, RequestOutput("a", finished=True, finish_reason=FinishReason.LENGTH)),
            (1, RequestOutput("b", finished=True, finish_reason=FinishReason.STOP))]
    sub, batches = _submission(outs)
    assert batches == [outs] and not sub.open


def test_stream_events_one_write_per_batch_and_error_ends_stream():
    outs = [(0, RequestOutput("a", text="x")),
            (1, RequestOutput("b", finished=True, finish_reason=FinishReason.ERROR,
                              error="boom")),
            (0, RequestOutput("a", text="never sent"))]

    async def main():
        sub = _queued(outs)
        gen = stream_events(sub, [{"first": 1}], lambda i, o: {"i": i, "text": o.text},
                            lambda: [{"last": 1}])
        return [piece async for piece in gen]

    pieces = asyncio.run(main())
    assert pieces[0] == 'data: {"first": 1}\n\n'
    assert pieces[1].count("data: ") == 2 and '"text": "x"' in pieces[1]
    assert '"boom"' in pieces[1] and "never sent" not in "".join(pieces)
    assert pieces[-1] == "data: [DONE]\n\n" and "last" not in "".join(pieces)


def test_idle_batches_are_empty_and_named_streams_ping():
    done = RequestOutput("t-0", "x", (5,), finished=True, finish_reason=FinishReason.STOP)

    async def main():
        sub = _queued([])
        sub.ids, sub.open = ["t-0"], {0}
        it = sub.batches(idle=0.01)
        assert await anext(it) == []  # nothing came within idle: an empty batch
        sub.queue.put_nowait((0, done))
        assert await anext(it) == [(0, done)]
        sub = _queued([])
        sub.ids, sub.open = ["t-0"], {0}
        events = NamedStream([("start", {})], lambda out: [("out", {"text": out.text})],
                             lambda status, msg: [], [("ping", {})], idle=0.01)
        body = stream_named(sub, events)
        first, ping = await anext(body), await anext(body)
        sub.queue.put_nowait((0, done))
        return first, ping, [s async for s in body]

    first, ping, rest = asyncio.run(main())
    assert first == 'event: start\ndata: {}\n\n' and ping == 'event: ping\ndata: {}\n\n'
    assert rest == ['event: out\ndata: {"text": "x"}\n\n']
