"""Submission.batches groups what is already queued; stream_events writes one SSE string
per batch with the same events as one per output."""

import asyncio
from types import SimpleNamespace

from engine.request import FinishReason
from engine.stream import RequestOutput
from service.generation import Submission, stream_events


def _queued(outputs) -> Submission:
    """A two-choice submission with ``outputs`` already queued (inside an event loop)."""
    state = SimpleNamespace(engine=SimpleNamespace(abort=lambda rid: None),
                            settings=SimpleNamespace(request_timeout=None), dispatcher=None)
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
