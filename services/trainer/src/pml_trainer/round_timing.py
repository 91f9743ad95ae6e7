"""When a tenant with new executions gets its training round: once they stop arriving.

A round learns every execution the replay buffer holds when it starts. Started as soon as a
tenant had enough new traces, a burst (a backlog replayed, an evaluation's training fold, a
busy hour) was cut into rounds wherever the trainer happened to look, so what each version
learned, and which of them the gate kept, depended on timing rather than on the executions:
two replays of the same stream served models up to several points apart. A round now starts
once the tenant's executions have stopped arriving for `quiet_s`, or `max_wait_s` after they
began to wait, so that a steady stream is still learned from within a bounded delay.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class _Waiting:
    added: int  # the tenant's `added_count` when last seen
    changed_at: float  # when that count last grew
    since: float  # when the tenant was first seen waiting


class RoundTiming:
    """Per tenant, whether its pending executions are ready for a round; see the module
    docstring. State is the trainer process's own: a replica taking the lock over starts its
    own clock, which delays a round by at most `quiet_s`."""

    def __init__(
        self, quiet_s: float, max_wait_s: float, clock: Callable[[], float] = time.monotonic
    ) -> None:
        if quiet_s < 0 or max_wait_s < quiet_s:
            raise ValueError("need 0 <= quiet_s <= max_wait_s")
        self.quiet_s = quiet_s
        self.max_wait_s = max_wait_s
        self._clock = clock
        self._waiting: dict[str, _Waiting] = {}

    def ready_among(self, pending: dict[str, int]) -> list[str]:
        """The tenants of `pending` (tenant → executions ever added) whose round may start;
        a tenant no longer pending (trained, deleted) waits afresh when it is pending again."""
        for gone in self._waiting.keys() - pending.keys():
            del self._waiting[gone]
        return [tenant for tenant, added in pending.items() if self.ready(tenant, added)]

    def ready(self, tenant: str, added: int) -> bool:
        """Whether `tenant`, pending with `added` executions ever added, may start its round."""
        now = self._clock()
        seen = self._waiting.get(tenant)
        if seen is None:
            seen = self._waiting[tenant] = _Waiting(added, now, now)
        elif added != seen.added:
            seen.added, seen.changed_at = added, now
        return now - seen.changed_at >= self.quiet_s or now - seen.since >= self.max_wait_s

    def started(self, tenant: str) -> float:
        """The tenant's round starts: executions arriving from now on wait for the next one.
        Returns how long its executions waited for this round (seconds)."""
        seen = self._waiting.pop(tenant, None)
        return self._clock() - seen.since if seen is not None else 0.0
