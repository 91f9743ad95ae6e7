"""ModelSnapshots: lazy loading, coalesced rebuilds, whole swaps, drops.

The builder is a stand-in that the test releases step by step, so every interleaving of
requests, events and builds checked here is exact rather than timing-dependent. (The real
builder against the real stores is covered by test_models and test_hot_swap.)
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime

import numpy as np
import pytest

from pml_common.model_registry import ModelRecord
from pml_common.tool_first_stage import FusedFirstStage
from pml_scorer.models import TenantModel
from pml_scorer.snapshots import ModelSnapshots
from pml_shgat.hierarchy import Hierarchy
from pml_shgat.memory import FEATURES, Execution, MemoryRanker, ServedMemory
from pml_shgat.params import init_params, make_config
from pml_shgat.serving import ServingModel

DIM = 16


def tenant_model(
    tenant: str, version: int, *, empty: bool = False, remembered: int = 0
) -> TenantModel:
    """A model of one tool (none when `empty`), with an execution memory of `remembered`."""
    tools = {} if empty else {"a:b": np.ones(DIM)}
    hierarchy = Hierarchy.build(tools, [], dim=DIM)
    config = make_config(DIM, 8, hierarchy.num_nodes)
    record = ModelRecord(
        tenant_id=tenant, version=f"v{version}", fencing_token=version, trained_at=datetime.now(UTC)
    )
    model = ServingModel(config, init_params(config, hierarchy.features, 0), hierarchy)
    return TenantModel(
        tenant_id=tenant,
        model=model,
        record=record,
        built_at=datetime.now(UTC),
        graph_digest=b"",
        registry_version=record.version,
        baseline=FusedFirstStage.of_vectors(list(tools), list(tools.values())),
        memory=_memory(remembered, list(tools)) if remembered else None,
    )


def _memory(executions: int, tools: list[str]) -> ServedMemory:
    ranker = MemoryRanker(
        tuple(Execution(np.ones(DIM), tuple(tools)) for _ in range(executions)),
        np.zeros(len(FEATURES) + 1),
        np.zeros(len(FEATURES)),
        np.ones(len(FEATURES)),
    )
    return ranker.serve(tools, ["a"] * len(tools))


@dataclass
class GatedBuilder:
    """Builds version 1, 2, 3… each only once the test lets it finish."""

    empty: bool = False
    remembered: int = 0
    started: int = 0
    finished: int = 0
    fail_next: bool = False
    gate: asyncio.Semaphore = field(default_factory=lambda: asyncio.Semaphore(0))
    begun: asyncio.Event = field(default_factory=asyncio.Event)

    async def build(self, tenant: str, current: TenantModel | None = None) -> TenantModel:
        self.started += 1
        self.begun.set()
        await self.gate.acquire()
        if self.fail_next:
            self.fail_next = False
            raise ConnectionError("neo4j is down")
        self.finished += 1
        return tenant_model(tenant, self.finished, empty=self.empty, remembered=self.remembered)

    def release(self, builds: int = 1) -> None:
        for _ in range(builds):
            self.gate.release()


async def settle() -> None:
    for _ in range(5):
        await asyncio.sleep(0)


async def serving_v1() -> tuple[GatedBuilder, ModelSnapshots]:
    """Snapshots serving version 1 of tenant "t", and their builder."""
    builder = GatedBuilder()
    snapshots = ModelSnapshots(builder)
    builder.release()
    await snapshots.get("t")
    return builder, snapshots


async def test_first_requests_share_one_load_and_then_read_without_building() -> None:
    builder = GatedBuilder()
    snapshots = ModelSnapshots(builder)
    requests = [asyncio.create_task(snapshots.get("t")) for _ in range(5)]
    await settle()
    assert builder.started == 1
    builder.release()
    models = await asyncio.gather(*requests)
    assert {m.version for m in models} == {"v1"}
    assert all(m is models[0] for m in models)
    assert await snapshots.get("t") is models[0]
    assert builder.started == 1
    assert snapshots.loaded() == ["t"]


async def test_refreshes_during_a_build_coalesce_into_one_more_build() -> None:
    builder, snapshots = await serving_v1()

    first = asyncio.create_task(snapshots.refresh("t"))
    await settle()
    assert builder.started == 2  # building v2
    # Three events arrive while v2 builds: they need a build that starts after them.
    late = [asyncio.create_task(snapshots.refresh("t")) for _ in range(3)]
    await settle()
    assert builder.started == 2
    # Requests keep being answered by the installed model meanwhile.
    assert (await snapshots.get("t")).version == "v1"
    builder.release()
    await first
    assert (await snapshots.get("t")).version == "v2"
    await settle()
    assert builder.started == 3  # one build for the three late events
    assert not any(t.done() for t in late)  # they return only once their change is served
    builder.release()
    await asyncio.gather(*late)
    assert (await snapshots.get("t")).version == "v3"
    assert builder.started == 3


async def test_refresh_ignores_tenants_not_served() -> None:
    builder = GatedBuilder()
    snapshots = ModelSnapshots(builder)
    await snapshots.refresh("elsewhere")
    assert builder.started == 0


async def test_an_event_during_the_first_load_triggers_a_rebuild() -> None:
    builder = GatedBuilder()
    snapshots = ModelSnapshots(builder)
    load = asyncio.create_task(snapshots.get("t"))
    await settle()
    event = asyncio.create_task(snapshots.refresh("t"))  # the load may have read stale data
    builder.release(2)
    assert (await load).version == "v1"
    await event
    assert (await snapshots.get("t")).version == "v2"


async def test_a_failed_build_fails_its_waiters_and_keeps_the_model() -> None:
    builder, snapshots = await serving_v1()
    builder.fail_next = True
    builder.release()
    with pytest.raises(ConnectionError):
        await snapshots.refresh("t")
    assert (await snapshots.get("t")).version == "v1"
    builder.release()
    await snapshots.refresh("t")  # the bus's retry
    assert (await snapshots.get("t")).version == "v2"


async def test_drop_forgets_and_a_build_in_flight_does_not_resurrect() -> None:
    builder, snapshots = await serving_v1()
    refresh = asyncio.create_task(snapshots.refresh("t"))
    await settle()
    snapshots.drop("t")
    builder.release()
    await refresh
    assert snapshots.peek("t") is None
    assert snapshots.loaded() == []
    builder.release()
    assert (await snapshots.get("t")).version == "v3"  # loaded fresh on the next request


async def test_empty_tenants_are_answered_but_not_kept() -> None:
    builder = GatedBuilder(empty=True)
    snapshots = ModelSnapshots(builder)
    builder.release()
    model = await snapshots.get("nobody")
    assert model.is_empty
    assert snapshots.peek("nobody") is None
    assert snapshots._slots == {}  # no bookkeeping left behind either


async def test_past_the_capacity_the_least_recently_used_tenant_is_dropped_then_rebuilt() -> None:
    builder = GatedBuilder()
    snapshots = ModelSnapshots(builder, max_nodes=1)  # every model here has one tool
    builder.release(2)
    assert (await snapshots.get("t")).version == "v1"
    assert (await snapshots.get("u")).version == "v2"
    assert snapshots.loaded() == ["u"]
    assert snapshots._slots == {}  # nothing of "t" is kept
    # No longer served: its events leave it alone (a build would wait on the gate forever).
    await asyncio.wait_for(snapshots.refresh("t"), timeout=5)
    assert builder.started == 2
    builder.release()
    assert (await snapshots.get("t")).version == "v3"  # built again on its next request
    assert snapshots.loaded() == ["t"]


async def test_remembered_executions_weigh_in_the_bound() -> None:
    builder = GatedBuilder(remembered=3)
    snapshots = ModelSnapshots(builder, max_nodes=6)  # two models of one tool would fit
    builder.release(2)
    await snapshots.get("t")
    await snapshots.get("u")
    assert snapshots.loaded() == ["u"]  # each weighs 1 tool + 3 executions


async def test_a_tenant_being_rebuilt_is_not_dropped_for_another() -> None:
    builder = GatedBuilder()
    snapshots = ModelSnapshots(builder, max_nodes=1)
    builder.release()
    await snapshots.get("t")
    loading = asyncio.create_task(snapshots.get("u"))
    await settle()
    refresh = asyncio.create_task(snapshots.refresh("t"))
    await settle()
    builder.release()  # "u" is built first, while "t" is still rebuilding
    assert (await loading).version == "v2"
    assert snapshots.loaded() == ["t", "u"]  # over the capacity, "t" busy
    assert snapshots.peek("t") is not None
    builder.release()
    await refresh
    assert snapshots.peek("u") is not None
    # "t" rebuilt and idle again: the bound holds once more, least recently used first
    # (a rebuild is not a use).
    assert snapshots.loaded() == ["u"]
