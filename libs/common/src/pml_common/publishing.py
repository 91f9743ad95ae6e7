"""Publishing the events of one request: in order, and to the end once started.

A request that stores something and announces it (a registration, a document submission)
publishes last, once everything is stored. From the first event out, its consumers apply what
it announces: the request can no longer be undone, so its publishing is finished even if the
caller goes away meanwhile (the task cancelled). A bus that fails on the first event leaves
nothing out, and the request can be undone whole; one that fails after some events are out is
reported as `PublishInterrupted`, which says how many are out.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Protocol

from pml_common.events import Event


class Publisher(Protocol):
    async def publish(self, event: Event) -> str: ...


class PublishInterrupted(Exception):
    """The bus failed after the first `len(published)` of `total` events were published."""

    def __init__(self, published: Sequence[str], total: int, cause: Exception) -> None:
        super().__init__(
            f"the bus failed after {len(published)} of {total} events were published "
            f"({type(cause).__name__}: {cause})"
        )
        self.published = list(published)
        self.total = total


async def publish_all(publisher: Publisher, events: Sequence[Event]) -> list[str]:
    """Publish `events` in order; what `publish` returned for each (see the module's doc)."""
    publishing = asyncio.create_task(_publish_each(publisher, events))
    try:
        return await asyncio.shield(publishing)
    except asyncio.CancelledError:
        # The caller went away: finish, so that what is announced is announced whole.
        return await publishing


async def _publish_each(publisher: Publisher, events: Sequence[Event]) -> list[str]:
    published: list[str] = []
    for event in events:
        try:
            published.append(await publisher.publish(event))
        except Exception as exc:
            if not published:
                raise
            raise PublishInterrupted(published, len(events), exc) from exc
    return published
