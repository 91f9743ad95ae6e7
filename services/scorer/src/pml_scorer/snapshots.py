"""The scorer's current model of each tenant, swapped whole.

Requests read: `await snapshots.get(tenant)` returns one `TenantModel` reference, which the
request uses for everything it computes, so no response mixes two versions. A tenant is loaded
on its first request and kept current by events (`refresh`, `drop`).

Writes are rebuilds, one at a time per tenant (a per-tenant lock), installed by a single dict
assignment, which the event loop makes atomic for readers. Rebuild requests coalesce: each
`refresh` bumps the tenant's request counter and waits until a build that *started after* it has
finished. Refreshes arriving while a build runs therefore share one more build (the "dirty"
case), and none of them returns before its change is in the served model — so an event handler
that returns has really applied its event. A failed build fails only the handler that ran it
(the bus retries it); the refreshes that were waiting for it share one more build.

Tenants without a single tool or capability are not kept (answered, then forgotten), so requests
naming arbitrary tenants cannot grow memory; their models are small and quick to build.

Memory: the models hold at most `max_nodes` graph nodes over all tenants
(`PML_SCORER_CACHE_MAX_NODES`); the least recently used tenants are dropped and built again on
their next request, and, no longer loaded, are not rebuilt by events meanwhile. A tenant being
loaded, rebuilt or waited for is never dropped. A tenant's rebuild bookkeeping lives only while
someone is loading, rebuilding or waiting for it.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Protocol

import structlog

from pml_common.settings import Settings
from pml_common.tenant_cache import TenantCache
from pml_scorer.models import TenantModel

log = structlog.get_logger(__name__)

#: Default of `max_nodes`: the setting's.
MAX_NODES: int = Settings.model_fields["scorer_cache_max_nodes"].default


class Builder(Protocol):
    async def build(self, tenant: str, current: TenantModel | None = None) -> TenantModel: ...


@dataclass
class _Slot:
    """Rebuild bookkeeping of one tenant, which exists while some coroutine is inside `_ensure`
    for it: a build under way, or requests and refreshes waiting for one."""

    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    #: Refreshes asked for so far, and how many of them the installed model covers.
    requested: int = 0
    built: int = 0
    #: Coroutines inside `_ensure` for this tenant (the slot is forgotten when it drops to 0:
    #: counters matter only to those waiting, and an idle loaded tenant needs none).
    users: int = 0


def _nodes(model: TenantModel) -> int:
    """Graph nodes, plus one per remembered execution (an intent vector each, like a node) and
    one per row of the query adapter's maps (an embedding-sized vector each)."""
    remembered = len(model.memory.memory) if model.memory is not None else 0
    adapter = model.adapter.rows if model.adapter is not None else 0
    return max(1, model.model.hierarchy.num_nodes + remembered + adapter)


class ModelSnapshots:
    def __init__(self, builder: Builder, max_nodes: int = MAX_NODES) -> None:
        self._builder = builder
        self._models: TenantCache[str, TenantModel] = TenantCache(
            "scorer.models", max_nodes, _nodes, busy=self._busy
        )
        self._slots: dict[str, _Slot] = {}

    async def get(self, tenant: str) -> TenantModel:
        """The tenant's current model, loading it on first use."""
        current = self._models.get(tenant)
        if current is not None:
            return current
        return await self._ensure(tenant, newer=False)

    async def refresh(self, tenant: str) -> None:
        """Rebuild a tenant this replica serves (or is loading); others load fresh anyway."""
        if tenant in self._models or self._busy(tenant):
            await self._ensure(tenant, newer=True)

    def drop(self, tenant: str) -> None:
        """Forget the tenant; a build in progress for it will not install its result."""
        self._slots.pop(tenant, None)
        dropped = self._models.pop(tenant)
        if dropped is not None:
            log.info("scorer.model_dropped", tenant=tenant, version=dropped.version)

    def peek(self, tenant: str) -> TenantModel | None:
        """The installed model, without loading (None when not loaded)."""
        return self._models.peek(tenant)

    def loaded(self) -> list[str]:
        return sorted(self._models.keys())

    def _busy(self, tenant: str) -> bool:
        """Being loaded, rebuilt or waited for: not to be evicted (its build would install a
        model nobody counts, or a waiting refresh would find it gone)."""
        return tenant in self._slots

    async def _ensure(self, tenant: str, *, newer: bool) -> TenantModel:
        slot = self._slots.get(tenant)
        if slot is None:
            slot = self._slots[tenant] = _Slot()
        if newer:
            slot.requested += 1
        # A first request is content with any built model; a refresh needs one built after it.
        wanted = slot.requested if newer else 0
        slot.users += 1
        try:
            async with slot.lock:
                installed = self._models.peek(tenant)
                if installed is not None and slot.built >= wanted:
                    return installed
                covers = slot.requested  # every refresh asked for until now sees this build
                started = time.perf_counter()
                fresh = await self._builder.build(tenant, installed)
                if self._slots.get(tenant) is slot:  # not dropped while building
                    slot.built = covers
                    self._install(tenant, installed, fresh, time.perf_counter() - started)
                return fresh
        finally:
            slot.users -= 1
            if slot.users == 0 and self._slots.get(tenant) is slot:
                del self._slots[tenant]
                self._models.shrink()  # no longer busy: back under the capacity if it was over

    def _install(
        self, tenant: str, old: TenantModel | None, new: TenantModel, seconds: float
    ) -> None:
        if new is old:
            log.debug("scorer.model_unchanged", tenant=tenant, version=new.version)
            return
        if new.is_empty:
            if self._models.pop(tenant) is not None:
                log.info("scorer.model_unloaded", tenant=tenant, reason="no tools or capabilities")
            return
        # The swap: one assignment, seen whole by every reader. A rebuild keeps the tenant's
        # place in the eviction order (an event is not a use); a first load is a use.
        if old is None:
            self._models.put(tenant, new)
        else:
            self._models.replace(tenant, new)
        hierarchy = new.model.hierarchy
        log.info(
            "scorer.model_swapped",
            tenant=tenant,
            old_version=old.version if old is not None else None,
            new_version=new.version,
            build_ms=round(seconds * 1000.0, 1),
            tools=hierarchy.num_tools,
            capabilities=hierarchy.num_capabilities,
            levels=hierarchy.num_levels,
            heads=new.model.config.heads,
        )
