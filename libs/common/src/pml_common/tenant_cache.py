"""A bounded in-process cache of per-tenant state, least recently used dropped first.

Services keep each tenant's catalog, graph or model in memory, loaded from the stores on the
tenant's first request. Tenant ids come from outside, so that memory is bounded here: each
cached value has a weight (the entries or nodes it holds, read when the cache is checked, since
values grow in place), and once the weights add up to more than `capacity` the least recently
used tenants are dropped. A dropped tenant costs one read of the stores on its next request;
nothing is lost, the stores are the system of record.

A tenant whose state is being written (`busy`) is never dropped: its writer would update a value
nobody reads any more while a reader loaded an older one. The tenant just used is never dropped
either, so one tenant larger than the whole capacity is still served, alone.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

import structlog

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")

log = structlog.get_logger(__name__)


def _never_busy(_key: object) -> bool:
    return False


class TenantCache(Generic[K, V]):
    """`key -> value` holding at most `capacity` weight, least recently used evicted."""

    def __init__(
        self,
        name: str,
        capacity: int,
        weigh: Callable[[V], int],
        busy: Callable[[K], bool] = _never_busy,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"{name}: capacity must be at least 1, got {capacity}")
        self.name = name
        self.capacity = capacity
        self._weigh = weigh
        self._busy = busy
        self._values: OrderedDict[K, V] = OrderedDict()

    def __contains__(self, key: K) -> bool:
        return key in self._values

    def __len__(self) -> int:
        return len(self._values)

    def keys(self) -> list[K]:
        """The cached keys, least recently used first."""
        return list(self._values)

    def get(self, key: K) -> V | None:
        """The value, marked as just used; None when not cached."""
        value = self._values.get(key)
        if value is not None:
            self._values.move_to_end(key)
        return value

    def peek(self, key: K) -> V | None:
        """The value, without marking it used (for updates that are not requests)."""
        return self._values.get(key)

    def put(self, key: K, value: V) -> V:
        """Cache `value` under `key` (replacing any), then evict down to the capacity."""
        self._values[key] = value
        self._values.move_to_end(key)
        self.shrink()
        return value

    def replace(self, key: K, value: V) -> None:
        """Swap a cached value for a newer read, keeping its place in the order (an update is
        not a use); a key no longer cached stays out."""
        if key in self._values:
            self._values[key] = value
            self.shrink()

    def setdefault(self, key: K, value: V) -> V:
        """The cached value of `key`, or `value` once cached (two loads of one tenant that
        overlapped agree on one value)."""
        cached = self.get(key)
        return cached if cached is not None else self.put(key, value)

    def pop(self, key: K) -> V | None:
        return self._values.pop(key, None)

    def weight(self) -> int:
        return sum(self._weigh(value) for value in self._values.values())

    def shrink(self) -> list[K]:
        """Evict least recently used values until the weights fit; returns the evicted keys.

        Call it after a cached value grew in place."""
        total = self.weight()
        evicted: list[K] = []
        newest = next(reversed(self._values), None)
        for key in list(self._values):
            if total <= self.capacity:
                break
            if key == newest or self._busy(key):
                continue
            total -= self._weigh(self._values.pop(key))
            evicted.append(key)
        if evicted:
            log.info(
                "tenant_cache.evicted",
                cache=self.name,
                evicted=len(evicted),
                kept=len(self._values),
                weight=total,
                capacity=self.capacity,
            )
        return evicted
