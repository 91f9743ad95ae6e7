"""Events keep every scorer replica's models current, without restarts."""

from __future__ import annotations

from collections.abc import AsyncIterator

import grpc
import neo4j
import pytest
from redis.asyncio import Redis

from pml.v1 import scorer_pb2, scorer_pb2_grpc
from pml_common.events import GraphChanged, TenantDeleted
from pml_common.model_registry import ModelRegistry
from pml_common.settings import Settings
from pml_common.testing import eventually
from pml_scorer.consumers import EVENTS, replica_group
from pml_scorer.main import ScorerApp

from .helpers import announce_model, untrained_reference, variant, write_capability, write_catalog

INTENT = "summarise a pdf document"


async def capability_ids(app: ScorerApp, tenant: str) -> list[str]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as channel:
        reply = await scorer_pb2_grpc.ScorerServiceStub(channel).ScoreCapabilities(
            scorer_pb2.ScoreRequest(tenant_id=tenant, text=INTENT, top_k=100), timeout=30
        )
    return [s.id for s in reply.scores]


async def version_of(app: ScorerApp, tenant: str) -> str:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as channel:
        reply = await scorer_pb2_grpc.ScorerServiceStub(channel).ModelInfo(
            scorer_pb2.ModelInfoRequest(tenant_id=tenant), timeout=30
        )
    return reply.version


@pytest.fixture
async def replicas(settings: Settings) -> AsyncIterator[list[ScorerApp]]:
    apps = [
        ScorerApp(
            settings.model_copy(update={"consumer_name": f"{settings.consumer_name}-{i}"}), port=0
        )
        for i in range(2)
    ]
    for app in apps:
        await app.start()
    yield apps
    for app in apps:
        await app.stop()


async def test_a_new_capability_is_scored_after_graph_changed_without_restart(
    app: ScorerApp, graph_db: neo4j.AsyncDriver, tenant: str
) -> None:
    await write_catalog(graph_db, tenant)
    before = await capability_ids(app, tenant)
    assert "cap:summarise_pdf" not in before

    await write_capability(
        graph_db,
        tenant,
        "cap:summarise_pdf",
        "summarise a pdf",
        "Read a PDF document and write a short summary of it.",
        ["filesystem:read_file"],
    )
    # Written but not announced: the loaded model is still served.
    assert await capability_ids(app, tenant) == before
    await app.bus.publish(
        GraphChanged.create(
            tenant_id=tenant, reason="capability_learned", node_ids=["cap:summarise_pdf"]
        )
    )
    after = await eventually(lambda: capability_ids(app, tenant), lambda ids: len(ids) == 5)
    assert after[0] == "cap:summarise_pdf"


async def test_every_replica_follows_published_models_and_deletions(
    replicas: list[ScorerApp],
    graph_db: neo4j.AsyncDriver,
    redis: Redis,
    registry: ModelRegistry,
    settings: Settings,
    tenant: str,
) -> None:
    await write_catalog(graph_db, tenant)
    for app in replicas:
        assert await version_of(app, tenant) == "untrained"

    first = replicas[0]
    _, config, params = await untrained_reference(graph_db, settings, tenant, first.embedder)
    trained = variant(config, params, 7)
    record = await announce_model(first.bus, registry, redis, tenant, config, trained)
    for app in replicas:
        await eventually(lambda a=app: version_of(a, tenant), lambda v: v == record.version)

    await first.bus.publish(TenantDeleted.create(tenant_id=tenant))
    for app in replicas:
        await eventually(
            lambda a=app: _loaded(a, tenant),
            lambda loaded: not loaded,
        )


async def _loaded(app: ScorerApp, tenant: str) -> bool:
    return tenant in app.snapshots.loaded()


async def test_the_replica_group_starts_at_the_stream_end_and_is_removed_on_stop(
    settings: Settings, redis: Redis, tenant: str
) -> None:
    app = ScorerApp(settings, port=0)
    seen: list[str] = []

    async def record(tenant_id: str) -> None:
        seen.append(tenant_id)

    app.snapshots.refresh = record  # type: ignore[method-assign, unused-ignore]
    # Published before the replica runs: not replayed into it (it loads tenants fresh).
    await app.bus.publish(GraphChanged.create(tenant_id=f"{tenant}-old", reason="old news"))
    await app.start()
    group = replica_group(settings.consumer_name)
    try:
        await app.bus.publish(GraphChanged.create(tenant_id=tenant, reason="news"))
        await eventually(lambda: _copy(seen), lambda s: tenant in s)
        assert f"{tenant}-old" not in seen  # a stream is read in order: it would come first
        for event_type in EVENTS:
            names = [g["name"].decode() for g in await redis.xinfo_groups(event_type.STREAM)]
            assert group in names
    finally:
        await app.stop()
    for event_type in EVENTS:
        names = [g["name"].decode() for g in await redis.xinfo_groups(event_type.STREAM)]
        assert group not in names


async def _copy(values: list[str]) -> list[str]:
    return list(values)
