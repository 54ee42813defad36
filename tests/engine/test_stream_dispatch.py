"""LoopDispatcher: items put from another thread reach their asyncio queues in order, and a
burst of puts costs one loop wake-up, not one per item."""

import asyncio
import threading

from engine.stream import AsyncStream, LoopDispatcher


class CountingLoop:
    """Wraps a loop, counting call_soon_threadsafe calls."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.calls = 0

    def call_soon_threadsafe(self, cb, *args):
        self.calls += 1
        return self.loop.call_soon_threadsafe(cb, *args)


def test_burst_from_another_thread_is_one_wakeup_and_keeps_order():
    async def main():
        loop = CountingLoop(asyncio.get_running_loop())
        d = LoopDispatcher(loop)  # type: ignore[arg-type]
        queues = [asyncio.Queue() for _ in range(4)]

        def engine_step(step: int) -> None:  # one output per request, like an engine step
            for i, q in enumerate(queues):
                d.put(q, (step, i))

        for step in range(3):
            t = threading.Thread(target=engine_step, args=(step,))
            t.start()
            t.join()
            await asyncio.sleep(0)  # the loop drains between steps
        got = [[q.get_nowait() for _ in range(q.qsize())] for q in queues]
        return loop.calls, got

    calls, got = asyncio.run(main())
    assert calls == 3  # one per burst, not 12
    assert got == [[(s, i) for s in range(3)] for i in range(4)]


def test_async_stream_ends_on_finished_output_and_drops_after_loop_close():
    from engine.request import FinishReason
    from engine.stream import RequestOutput

    async def main():
        s = AsyncStream("r", asyncio.get_running_loop())
        outs = [RequestOutput("r", text=str(k)) for k in range(3)]
        outs.append(RequestOutput("r", finished=True, finish_reason=FinishReason.LENGTH))
        threading.Thread(target=lambda: [s.put(o) for o in outs]).start()
        return [o async for o in s], s

    got, stream = asyncio.run(main())
    assert [o.text for o in got] == ["0", "1", "2", ""] and got[-1].finished
    stream.put(RequestOutput("r"))  # loop closed: silently dropped, no exception
