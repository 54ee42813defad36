"""EncoderThread: the one thread image encodes run on, with its own cap on torch's
intra-op threads (``--vision-encoder-threads``), so an encode cannot take every core
from the engine's decode steps.

Why a thread of its own: ``torch.set_num_threads`` is not process-wide in effect. With
the OpenMP backend it sets the *calling* thread's OpenMP team size and MKL thread count
(``omp_set_num_threads``, ``mkl_set_num_threads_local``), and it also stores the value
as the default that every thread not yet initialized adopts on its first parallel op.
So calling it per encode on a request thread would leave that thread capped and hand
the cap to any thread that starts later (measured: a fresh thread after a side thread's
``set_num_threads(1)`` reports 1), while the engine thread, initialized earlier, keeps
its own count. Here the worker initializes torch's per-thread state first (so the lazy
first-op init cannot undo the cap), then sets the cap; the constructing thread then
writes the previous value back as the default. Measured with the per-thread CPU clock,
a capped worker does all of its GEMM work on its own thread (process CPU / worker CPU
= 1.00 at cap 1, 2.0 at cap 2 on 2 cores).

Encodes are serialized (one worker): concurrent encodes would only share the same cores."""

from __future__ import annotations

import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import torch

T = TypeVar("T")


def available_cpus() -> int:
    """CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class EncoderThread:
    def __init__(self, threads: int | None = None) -> None:
        """threads None: the constructing thread's torch.get_num_threads() (--threads)."""
        previous = torch.get_num_threads()
        self.threads = previous if threads is None else threads
        if self.threads < 1:
            raise ValueError(f"vision encoder threads must be >= 1, got {self.threads}")
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="fp8serve-vision-encoder",
                                        initializer=self._init)
        self.effective = self._pool.submit(torch.get_num_threads).result()
        torch.set_num_threads(previous)  # the process default other threads adopt

    def _init(self) -> None:
        torch.get_num_threads()  # this thread's lazy init happens now, not after the cap
        torch.set_num_threads(self.threads)

    def run(self, fn: Callable[..., T], *args: object) -> T:
        """fn(*args) on the encoder thread; blocks the caller until done, re-raises."""
        return self._pool.submit(fn, *args).result()

    def close(self) -> None:
        self._pool.shutdown(wait=False)
