"""Reads done ahead of the questions that need them.

Search keeps per-tenant reads in memory (a tenant's names and propagation graph,
`pml_search.propagation`; its chunk vectors with the embedded store, `pml_search.chunk_memory`)
and drops them when what they hold changes. Read again only when the next question asks, they
would make the first question after each ingestion wait for them (seconds for thousands of
documents). A `ReadAhead` reads them again in the background once the tenant has been quiet for
a while: `delay_s` after its last change, and at least `cost_ratio` times as long as its last
read took when that is known, so a tenant that changes now and then spends at most that share
of a core on reads nobody asked for yet. Each change within the wait postpones the read: a
tenant being ingested is read once, when its ingestion is over.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable

import structlog

log = structlog.get_logger(__name__)

#: Quiet time before a changed tenant is read ahead.
DELAY_S = 5.0
#: ... and at least this many times as long as the tenant's last read took (a twentieth of a
#: core at most on reads ahead, for a tenant that changes now and then).
COST_RATIO = 20.0


class ReadAhead:
    """Schedules `read(tenant)` in the background once the tenant has been quiet."""

    def __init__(
        self,
        name: str,
        read: Callable[[str], Awaitable[object]],
        delay_s: float = DELAY_S,
        cost_ratio: float = COST_RATIO,
    ) -> None:
        self._name = name
        self._read = read
        self._delay_s = delay_s
        self._cost_ratio = cost_ratio
        self._scheduled: dict[str, asyncio.TimerHandle] = {}
        self._running: set[asyncio.Task[None]] = set()

    def changed(self, tenant: str, last_read_s: float) -> None:
        """The tenant's data changed: read it once it has been quiet (postponed by each change).
        `last_read_s`: how long its last read took, when known (else 0)."""
        self.drop(tenant)
        delay = max(self._delay_s, self._cost_ratio * last_read_s)
        self._scheduled[tenant] = asyncio.get_running_loop().call_later(delay, self._start, tenant)

    def drop(self, tenant: str) -> None:
        """No read ahead for the tenant until its next change (it was deleted from)."""
        pending = self._scheduled.pop(tenant, None)
        if pending is not None:
            pending.cancel()

    def _start(self, tenant: str) -> None:
        del self._scheduled[tenant]
        task = asyncio.create_task(self._read_quietly(tenant))
        self._running.add(task)
        task.add_done_callback(self._running.discard)

    async def _read_quietly(self, tenant: str) -> None:
        try:
            await self._read(tenant)
        except Exception:  # the next question reads again, and fails with its reason if it must
            log.exception("search.read_ahead_failed", cache=self._name, tenant=tenant)

    async def close(self) -> None:
        """Drops the reads scheduled and under way (the service is stopping)."""
        for pending in self._scheduled.values():
            pending.cancel()
        self._scheduled.clear()
        for task in list(self._running):
            task.cancel()
        await asyncio.gather(*self._running, return_exceptions=True)
