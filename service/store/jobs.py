"""The background responses running (service/store/background.py), per API key: what
``GET``, ``cancel`` and ``DELETE`` on /v1/responses/{id} find while a run goes on, and what
the server cancels when it stops. Kept apart from the jobs themselves, which read engine
submissions, so that the serving state holds it without importing them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any, Protocol


class Job(Protocol):
    """What the routes use of a running job (service.store.background.BackgroundJob)."""

    tenant: str
    keep_events: bool
    input_items: Sequence[dict[str, Any]]
    frames: Sequence[str]  # the events so far, as SSE frames (with keep_events)

    @property
    def id(self) -> str: ...

    def snapshot(self) -> dict[str, Any]: ...

    def follow(self, after: int = -1) -> AsyncIterator[str]: ...

    def cancel(self) -> bool: ...


class BackgroundJobs:
    """The running jobs, per API key; every call is made on the event loop."""

    def __init__(self) -> None:
        self._jobs: dict[tuple[str, str], Job] = {}

    def __len__(self) -> int:
        return len(self._jobs)

    def add(self, job: Job) -> None:
        self._jobs[(job.tenant, job.id)] = job

    def get(self, tenant: str, response_id: str) -> Job | None:
        return self._jobs.get((tenant, response_id))

    def drop(self, job: Job) -> None:
        self._jobs.pop((job.tenant, job.id), None)

    def cancel_all(self) -> None:
        for job in list(self._jobs.values()):
            job.cancel()
