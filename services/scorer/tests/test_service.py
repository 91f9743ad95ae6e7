"""ScorerService over a real gRPC server (port 0), real embedder, Redis and Neo4j.

The scores served are compared with a `ServingModel` built independently here from the same
graph and parameters: the service must add nothing and lose nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable
from datetime import UTC, datetime
from typing import Any

import grpc
import neo4j
import numpy as np
import pytest
from redis.asyncio import Redis

from pml.v1 import scorer_pb2, scorer_pb2_grpc
from pml_common.lease_lock import FENCING_COUNTER_KEY
from pml_common.model_registry import ModelRegistry
from pml_common.prequential import PrequentialStore
from pml_common.settings import Settings
from pml_common.testing import eventually
from pml_common.tool_first_stage import embed_intents
from pml_common.tool_graph import read_tool_graph
from pml_scorer.main import ScorerApp
from pml_shgat.adapter import QueryAdapter
from pml_shgat.gating import ADAPTER_WEIGHT_METRIC, MEMORY_WEIGHT_METRIC, WEIGHT_METRIC, tool_scores
from pml_shgat.memory import FEATURES, Execution, MemoryRanker
from pml_shgat.params import read_version, to_bytes
from pml_shgat.serving import ScoredNode, ServingModel

from .helpers import (
    CAPABILITIES,
    TOOLS,
    announce_model,
    first_stage_reference,
    ranked,
    untrained_reference,
    variant,
    write_catalog,
)

INTENT = "take a screenshot of a web page"


def assert_same(served: Any, expected: list[ScoredNode]) -> None:
    """Served `Scored` messages equal the reference model's scores, in the same order."""
    assert [s.id for s in served] == [e.id for e in expected]
    assert [s.level for s in served] == [e.level for e in expected]
    np.testing.assert_allclose([s.score for s in served], [e.score for e in expected], atol=1e-9)


async def status_of(call: Awaitable[Any]) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.aio.AioRpcError) as info:
        await call
    return info.value.code(), info.value.details() or ""


@pytest.fixture
async def reference(
    app: ScorerApp, graph_db: neo4j.AsyncDriver, settings: Settings, tenant: str
) -> tuple[ServingModel, np.ndarray]:
    """The catalog written for the tenant; its untrained model and the intent's embedding,
    built here."""
    await write_catalog(graph_db, tenant)
    hierarchy, config, params = await untrained_reference(graph_db, settings, tenant, app.embedder)
    vector = (await app.embedder.embed_queries([INTENT]))[0]
    return ServingModel(config, params, hierarchy), vector


async def test_untrained_scores_equal_the_serving_model(
    app: ScorerApp,
    stub: scorer_pb2_grpc.ScorerServiceStub,
    reference: tuple[ServingModel, np.ndarray],
    graph_db: neo4j.AsyncDriver,
    settings: Settings,
    tenant: str,
) -> None:
    model, vector = reference

    caps = await stub.ScoreCapabilities(
        scorer_pb2.ScoreRequest(tenant_id=tenant, text=INTENT, top_k=100), timeout=30
    )
    assert caps.model_version == "untrained"
    assert_same(caps.scores, model.score_capabilities(vector, 100))
    assert len(caps.scores) == len(CAPABILITIES)
    # The untrained model ranks like cosine similarity: the screenshot capability wins.
    assert caps.scores[0].id == "cap:screenshot_page"

    # Tools: the untrained first stage (BM25 and cosine fused), no learned correction.
    tools = await stub.ScoreTools(
        scorer_pb2.ScoreRequest(tenant_id=tenant, text=INTENT, top_k=3), timeout=30
    )
    assert tools.correction_weight == 0.0
    first = await first_stage_reference(graph_db, settings, tenant, app.embedder, app.tool_embedder)
    [intent] = await embed_intents([INTENT], app.embedder, app.tool_embedder)
    assert_same(tools.scores, ranked(first.ids, first.scores(intent), 3))
    assert tools.scores[0].id == "playwright:browser_take_screenshot"
    assert all(s.level == -1 for s in tools.scores)

    # An embedding given directly scores like the text it was made from.
    by_vector = await stub.ScoreCapabilities(
        scorer_pb2.ScoreRequest(
            tenant_id=tenant, embedding=scorer_pb2.Embedding(values=vector.tolist()), top_k=100
        ),
        timeout=30,
    )
    assert_same(by_vector.scores, model.score_capabilities(vector, 100))


async def test_level_filter_top_by_level_and_defaults(
    stub: scorer_pb2_grpc.ScorerServiceStub,
    reference: tuple[ServingModel, np.ndarray],
    tenant: str,
) -> None:
    model, vector = reference

    level1 = await stub.ScoreCapabilities(
        scorer_pb2.ScoreRequest(tenant_id=tenant, text=INTENT, level=1), timeout=30
    )
    assert [s.id for s in level1.scores] == ["cap:publish"]
    assert_same(level1.scores, model.score_capabilities(vector, 10, level=1))
    level0 = await stub.ScoreCapabilities(
        scorer_pb2.ScoreRequest(tenant_id=tenant, text=INTENT, level=0), timeout=30
    )
    assert {s.id for s in level0.scores} == {c[0] for c in CAPABILITIES} - {"cap:publish"}
    assert all(s.level == 0 for s in level0.scores)
    beyond = await stub.ScoreCapabilities(
        scorer_pb2.ScoreRequest(tenant_id=tenant, text=INTENT, level=7), timeout=30
    )
    assert list(beyond.scores) == []

    # top_k 0 means the default (10): every tool of this small catalog.
    default = await stub.ScoreTools(
        scorer_pb2.ScoreRequest(tenant_id=tenant, text=INTENT), timeout=30
    )
    assert len(default.scores) == len(TOOLS)

    by_level = await stub.TopByLevel(
        scorer_pb2.TopByLevelRequest(tenant_id=tenant, intent=INTENT, k=2), timeout=30
    )
    expected = model.top_by_level(vector, 2)
    assert [lv.level for lv in by_level.levels] == [0, 1]
    for lv in by_level.levels:
        assert_same(lv.scores, expected[lv.level])
    assert by_level.model_version == "untrained"


async def test_predict_path_success(
    stub: scorer_pb2_grpc.ScorerServiceStub,
    reference: tuple[ServingModel, np.ndarray],
    tenant: str,
) -> None:
    model, vector = reference
    path = ["playwright:browser_navigate", "playwright:browser_take_screenshot", "cap:publish"]

    reply = await stub.PredictPathSuccess(
        scorer_pb2.PredictPathSuccessRequest(tenant_id=tenant, intent=INTENT, path=path),
        timeout=30,
    )
    assert reply.probability == pytest.approx(model.predict_path_success(vector, path), abs=1e-9)
    assert reply.model_version == "untrained"
    # Later steps weigh more: 1, 1.5, 2.
    scores = model.node_scores(vector, path)
    assert reply.probability == pytest.approx(
        (scores[0] + 1.5 * scores[1] + 2 * scores[2]) / 4.5, abs=1e-9
    )

    unknown = await stub.PredictPathSuccess(
        scorer_pb2.PredictPathSuccessRequest(tenant_id=tenant, intent=INTENT, path=["x:y"]),
        timeout=30,
    )
    assert unknown.probability == pytest.approx(0.5)
    empty = await stub.PredictPathSuccess(
        scorer_pb2.PredictPathSuccessRequest(tenant_id=tenant, intent=INTENT), timeout=30
    )
    assert empty.probability == pytest.approx(0.5)


async def test_model_info_untrained_then_published(
    app: ScorerApp,
    stub: scorer_pb2_grpc.ScorerServiceStub,
    graph_db: neo4j.AsyncDriver,
    redis: Redis,
    registry: ModelRegistry,
    settings: Settings,
    tenant: str,
) -> None:
    await write_catalog(graph_db, tenant)
    info = await stub.ModelInfo(scorer_pb2.ModelInfoRequest(tenant_id=tenant), timeout=30)
    assert info.version == "untrained"
    assert info.fencing_token == 0
    assert info.trained_at == ""
    assert dict(info.metrics) == {}
    assert (info.num_tools, info.num_capabilities, info.num_levels) == (
        len(TOOLS),
        len(CAPABILITIES),
        2,
    )
    assert info.num_heads == 4  # a small graph (seed 000: 4-16 heads by size)

    hierarchy, config, params = await untrained_reference(graph_db, settings, tenant, app.embedder)
    trained = variant(config, params, seed=1)
    record = await announce_model(
        app.bus, registry, redis, tenant, config, trained, {"loss": 0.25, "accuracy": 0.8}
    )
    info = await eventually(
        lambda: stub.ModelInfo(scorer_pb2.ModelInfoRequest(tenant_id=tenant), timeout=30),
        lambda i: i.version == record.version,
    )
    assert info.fencing_token == record.fencing_token
    assert datetime.fromisoformat(info.trained_at) == record.trained_at
    assert record.trained_at.tzinfo == UTC
    assert dict(info.metrics) == pytest.approx({"loss": 0.25, "accuracy": 0.8})

    # And the published parameters are what scores now.
    vector = (await app.embedder.embed_queries([INTENT]))[0]
    served = await stub.ScoreCapabilities(
        scorer_pb2.ScoreRequest(tenant_id=tenant, text=INTENT, top_k=100), timeout=30
    )
    assert served.model_version == record.version
    expected = ServingModel(config, trained, hierarchy).score_capabilities(vector, 100)
    assert_same(served.scores, expected)
    untrained = ServingModel(config, params, hierarchy).score_capabilities(vector, 100)
    assert not np.allclose([s.score for s in served.scores], [s.score for s in untrained])


async def test_unknown_tenant_gets_empty_scores_not_an_error(
    app: ScorerApp, stub: scorer_pb2_grpc.ScorerServiceStub, tenant: str
) -> None:
    request = scorer_pb2.ScoreRequest(tenant_id=tenant, text=INTENT)
    caps = await stub.ScoreCapabilities(request, timeout=30)
    tools = await stub.ScoreTools(request, timeout=30)
    assert (list(caps.scores), caps.model_version) == ([], "untrained")
    assert (list(tools.scores), tools.model_version) == ([], "untrained")
    by_level = await stub.TopByLevel(
        scorer_pb2.TopByLevelRequest(tenant_id=tenant, intent=INTENT), timeout=30
    )
    assert list(by_level.levels) == []
    info = await stub.ModelInfo(scorer_pb2.ModelInfoRequest(tenant_id=tenant), timeout=30)
    assert (info.version, info.num_tools, info.num_capabilities, info.num_levels) == (
        "untrained",
        0,
        0,
        0,
    )
    # Not kept: requests naming arbitrary tenants do not grow the scorer's memory.
    assert tenant not in app.snapshots.loaded()


async def test_empty_tenant_id_means_the_default_tenant(
    app: ScorerApp,
    stub: scorer_pb2_grpc.ScorerServiceStub,
    graph_db: neo4j.AsyncDriver,
    settings: Settings,
) -> None:
    await write_catalog(graph_db, settings.default_tenant)
    try:
        reply = await stub.ScoreTools(scorer_pb2.ScoreRequest(text=INTENT, top_k=1), timeout=30)
        assert reply.scores[0].id == "playwright:browser_take_screenshot"
        assert settings.default_tenant in app.snapshots.loaded()
    finally:
        await graph_db.execute_query(
            "MATCH (n {tenant_id: $t}) DETACH DELETE n", {"t": settings.default_tenant}
        )


async def test_bad_input_is_invalid_argument_with_a_message(
    app: ScorerApp, stub: scorer_pb2_grpc.ScorerServiceStub, settings: Settings, tenant: str
) -> None:
    score = stub.ScoreCapabilities
    dim = app.embedder.dim
    cases: list[tuple[Awaitable[Any], str]] = [
        (score(scorer_pb2.ScoreRequest(tenant_id=tenant)), "intent must be given"),
        (score(scorer_pb2.ScoreRequest(tenant_id=tenant, text="   ")), "must not be empty"),
        (
            score(scorer_pb2.ScoreRequest(text="x" * (settings.max_query_chars + 1))),
            f"the maximum is {settings.max_query_chars}",
        ),
        (
            score(scorer_pb2.ScoreRequest(embedding=scorer_pb2.Embedding(values=[0.1] * 3))),
            f"embedding has 3 values; this scorer's embeddings have {dim}",
        ),
        (
            score(scorer_pb2.ScoreRequest(embedding=scorer_pb2.Embedding(values=[0.0] * dim))),
            "all zeros",
        ),
        (
            score(
                scorer_pb2.ScoreRequest(embedding=scorer_pb2.Embedding(values=[float("nan")] * dim))
            ),
            "NaN",
        ),
        (
            score(scorer_pb2.ScoreRequest(text="x", top_k=settings.max_limit + 1)),
            f"top_k must be between 1 and {settings.max_limit}",
        ),
        (score(scorer_pb2.ScoreRequest(text="x", top_k=-1)), "top_k must be between"),
        (score(scorer_pb2.ScoreRequest(text="x", level=-1)), "level must be between 0 and 100"),
        (score(scorer_pb2.ScoreRequest(text="x", level=101)), "level must be between 0 and 100"),
        (
            stub.ScoreTools(scorer_pb2.ScoreRequest(text="x", level=0)),
            "level applies to capabilities only",
        ),
        (score(scorer_pb2.ScoreRequest(tenant_id="t" * 513, text="x")), "tenant_id is longer"),
        (stub.TopByLevel(scorer_pb2.TopByLevelRequest(intent="")), "intent must not be empty"),
        (
            stub.TopByLevel(scorer_pb2.TopByLevelRequest(intent="x", k=settings.max_limit + 1)),
            "k must be between 1 and",
        ),
        (
            stub.PredictPathSuccess(
                scorer_pb2.PredictPathSuccessRequest(intent="x", path=["a:b"] * 1001)
            ),
            "path holds 1001 node ids; the maximum is 1000",
        ),
        (
            stub.PredictPathSuccess(
                scorer_pb2.PredictPathSuccessRequest(intent="x", path=["a:b", " "])
            ),
            "invalid: path[1]",
        ),
        (
            stub.PredictPathSuccess(scorer_pb2.PredictPathSuccessRequest(path=["a:b"])),
            "intent must not be empty",
        ),
    ]
    for call, message in cases:
        code, details = await status_of(call)
        assert code == grpc.StatusCode.INVALID_ARGUMENT, details
        assert message in details, details


# --- served tool score: first stage + w · learned correction ---------------------------------


async def _served_tools(
    stub: scorer_pb2_grpc.ScorerServiceStub, tenant: str, version: str
) -> scorer_pb2.ScoreResponse:
    request = scorer_pb2.ScoreRequest(tenant_id=tenant, text=INTENT, top_k=100)
    reply: scorer_pb2.ScoreResponse = await eventually(
        lambda: stub.ScoreTools(request, timeout=30), lambda r: r.model_version == version
    )
    return reply


async def test_tools_are_served_as_the_first_stage_plus_the_weighted_correction(
    app: ScorerApp,
    stub: scorer_pb2_grpc.ScorerServiceStub,
    reference: tuple[ServingModel, np.ndarray],
    redis: Redis,
    registry: ModelRegistry,
    graph_db: neo4j.AsyncDriver,
    settings: Settings,
    tenant: str,
) -> None:
    _, vector = reference
    hierarchy, config, initial = await untrained_reference(graph_db, settings, tenant, app.embedder)
    params = variant(config, initial, seed=3)
    trained = ServingModel(config, params, hierarchy)
    first = await first_stage_reference(graph_db, settings, tenant, app.embedder, app.tool_embedder)
    [intent] = await embed_intents([INTENT], app.embedder, app.tool_embedder)
    ids = first.ids
    assert ids == hierarchy.tool_ids

    record = await announce_model(
        app.bus, registry, redis, tenant, config, params, {WEIGHT_METRIC: 0.5}
    )
    reply = await _served_tools(stub, tenant, record.version)
    assert reply.correction_weight == 0.5
    want = first.scores(intent) + 0.5 * tool_scores(trained, vector)
    assert_same(reply.scores, ranked(ids, want, 100))
    # the correction changes the ranking of this intent, so the check above can fail
    alone = ranked(ids, first.scores(intent), 100)
    assert [s.id for s in reply.scores] != [s.id for s in alone]

    # w = 0: the trained version serves capabilities, but tools rank exactly like the first
    # stage (the gate found no weight at which it helps)
    zero = await announce_model(
        app.bus, registry, redis, tenant, config, params, {WEIGHT_METRIC: 0}
    )
    reply = await _served_tools(stub, tenant, zero.version)
    assert reply.correction_weight == 0.0
    assert_same(reply.scores, alone)


async def test_a_version_with_an_execution_memory_serves_its_weighted_correction(
    app: ScorerApp,
    stub: scorer_pb2_grpc.ScorerServiceStub,
    reference: tuple[ServingModel, np.ndarray],
    redis: Redis,
    registry: ModelRegistry,
    graph_db: neo4j.AsyncDriver,
    settings: Settings,
    tenant: str,
) -> None:
    hierarchy, config, initial = await untrained_reference(graph_db, settings, tenant, app.embedder)
    first = await first_stage_reference(graph_db, settings, tenant, app.embedder, app.tool_embedder)
    graph = await read_tool_graph(graph_db, settings.neo4j_database, tenant, app.embedder)
    [intent] = await embed_intents([INTENT], app.embedder, app.tool_embedder)
    ids = first.ids
    alone = ranked(ids, first.scores(intent), 100)
    # One remembered execution of this very request, which ran the first stage's sixth tool;
    # the weights read the nearest intents' votes only.
    executed = alone[5].id
    weights = np.zeros(len(FEATURES) + 1)
    weights[1 + FEATURES.index("neighbour_votes")] = 5.0
    ranker = MemoryRanker(
        (Execution(np.asarray(intent.vector, np.float32), (executed,)),),
        weights,
        np.zeros(len(FEATURES)),
        np.ones(len(FEATURES)),
    )
    metrics = {WEIGHT_METRIC: 0.0, MEMORY_WEIGHT_METRIC: 2.0}
    record = await announce_model(
        app.bus, registry, redis, tenant, config, initial, metrics, ranker.to_arrays()
    )
    reply = await _served_tools(stub, tenant, record.version)
    assert reply.memory_weight == 2.0 and reply.correction_weight == 0.0
    stored = read_version(to_bytes(config, initial, ranker.to_arrays())).memory
    assert stored is not None
    served = stored.serve(hierarchy.tool_ids, graph.servers_of(hierarchy.tool_ids))
    scores = first.scores(intent)
    assert_same(
        reply.scores, ranked(ids, scores + 2.0 * served.correction(scores, intent.vector), 100)
    )
    assert reply.scores[0].id == executed != alone[0].id
    info = await stub.ModelInfo(scorer_pb2.ModelInfoRequest(tenant_id=tenant), timeout=30)
    assert info.memory_weight == 2.0 and info.memory_executions == 1
    assert info.last_accepted.memory_weight == 2.0


async def test_a_version_with_a_query_adapter_serves_its_share_of_the_adapted_first_stage(
    app: ScorerApp,
    stub: scorer_pb2_grpc.ScorerServiceStub,
    reference: tuple[ServingModel, np.ndarray],
    graph_db: neo4j.AsyncDriver,
    redis: Redis,
    registry: ModelRegistry,
    settings: Settings,
    tenant: str,
) -> None:
    _, config, initial = await untrained_reference(graph_db, settings, tenant, app.embedder)
    first = await first_stage_reference(graph_db, settings, tenant, app.embedder, app.tool_embedder)
    [intent] = await embed_intents([INTENT], app.embedder, app.tool_embedder)
    alone = ranked(first.ids, first.scores(intent), 100)
    # Maps that turn this request onto the first stage's last tool, model by model:
    # W = I − u·uᵀ + u·tᵀ sends the unit request u to the tool's unit vector t.
    target = first.ids.index(alone[-1].id)
    assert first.catalog is not None and intent.text_vectors is not None
    maps, start = [], 0
    for width in first.parts:
        u = intent.text_vectors[0][start : start + width]
        t = first.catalog[target, start : start + width]
        u, t = u / np.linalg.norm(u), t / np.linalg.norm(t)
        maps.append((np.eye(width) - np.outer(u, u) + np.outer(u, t)).astype(np.float32))
        start += width
    adapter = QueryAdapter(tuple(maps), first.parts)
    metrics = {WEIGHT_METRIC: 0.0, ADAPTER_WEIGHT_METRIC: 1.0}
    record = await announce_model(
        app.bus, registry, redis, tenant, config, initial, metrics, adapter.to_arrays()
    )
    reply = await _served_tools(stub, tenant, record.version)
    assert reply.adapter_weight == 1.0 and reply.correction_weight == 0.0
    stored = read_version(to_bytes(config, initial, adapter.to_arrays())).adapter
    assert stored is not None
    _, adapted = first.scores_adapted(intent, stored.adapt)
    assert adapted is not None
    assert_same(reply.scores, ranked(first.ids, adapted, 100))
    assert reply.scores[0].id == alone[-1].id != alone[0].id
    info = await stub.ModelInfo(scorer_pb2.ModelInfoRequest(tenant_id=tenant), timeout=30)
    assert info.adapter_weight == 1.0 and info.last_accepted.adapter_weight == 1.0


async def test_model_info_reports_weight_prequential_and_candidates(
    app: ScorerApp,
    stub: scorer_pb2_grpc.ScorerServiceStub,
    reference: tuple[ServingModel, np.ndarray],  # writes the catalog
    redis: Redis,
    registry: ModelRegistry,
    graph_db: neo4j.AsyncDriver,
    settings: Settings,
    tenant: str,
) -> None:
    _, config, initial = await untrained_reference(graph_db, settings, tenant, app.embedder)
    store = PrequentialStore(redis, window=2)
    for i, figures in enumerate([(1.0, 1.0, 1.0, 1.0), (0.0, 0.5, 1.0, 3.0), (0.0, 0.0, 0.5, 9.0)]):
        assert await store.record(tenant, f"e{i}", *figures)
    assert not await store.record(tenant, "e2", 0.0, 0.0, 0.0, 99.0)  # a redelivery: not twice
    gate = {
        "accepted": 1.0,
        WEIGHT_METRIC: 2.0,
        "holdout_size": 7.0,
        "holdout_candidate_recall_at_5": 0.6,
        "holdout_serving_recall_at_5": 0.4,
        "holdout_first_stage_recall_at_5": 0.3,
        "holdout_cross_fitted_recall_at_5": 0.5,
        "holdout_cross_fitted_mrr": 0.7,
        "traces_seen": 28.0,
        "holdout_novel_size": 2.0,
    }
    record = await announce_model(app.bus, registry, redis, tenant, config, initial, gate)
    token = int(await redis.incr(FENCING_COUNTER_KEY))
    rejected = await registry.reject(
        tenant, b"kept", token, {**gate, "accepted": 0.0, "holdout_candidate_recall_at_5": 0.2}
    )
    info = await eventually(
        lambda: stub.ModelInfo(scorer_pb2.ModelInfoRequest(tenant_id=tenant), timeout=30),
        lambda i: i.version == record.version,
    )
    assert info.correction_weight == 2.0
    window, total = info.prequential.window, info.prequential.cumulative
    assert (window.count, total.count) == (2, 3)
    assert window.recall_at_5 == pytest.approx(0.25) and window.first_rank == pytest.approx(6.0)
    assert total.recall_at_5 == pytest.approx(0.5) and total.first_rank == pytest.approx(13 / 3)
    assert total.recall_at_1 == pytest.approx(1 / 3) and total.recall_at_10 == pytest.approx(5 / 6)
    accepted = info.last_accepted
    assert (accepted.version, accepted.accepted, accepted.holdout_size) == (record.version, True, 7)
    assert (accepted.candidate_recall_at_5, accepted.serving_recall_at_5) == (0.6, 0.4)
    assert (accepted.first_stage_recall_at_5, accepted.correction_weight) == (0.3, 2.0)
    assert (accepted.cross_fitted_recall_at_5, accepted.cross_fitted_mrr) == (0.5, 0.7)
    assert (accepted.traces_seen, accepted.holdout_novel_size) == (28, 2)
    assert (info.last_rejected.version, info.last_rejected.accepted) == (rejected.version, False)
    assert info.last_rejected.candidate_recall_at_5 == 0.2


async def test_a_tenant_dropped_past_the_cache_bound_is_served_alike_once_rebuilt(
    settings: Settings, graph_db: neo4j.AsyncDriver, tenant: str
) -> None:
    """PML_SCORER_CACHE_MAX_NODES reaches the snapshots: one node holds one tenant at a time,
    and the tenant dropped for another is built again from the stores on its next request."""
    other = f"{tenant}-b"
    await write_catalog(graph_db, tenant)
    await write_catalog(graph_db, other)
    app = ScorerApp(settings.model_copy(update={"scorer_cache_max_nodes": 1}), port=0)
    await app.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{app.port}") as channel:
            stub = scorer_pb2_grpc.ScorerServiceStub(channel)

            async def score(who: str) -> scorer_pb2.ScoreResponse:
                request = scorer_pb2.ScoreRequest(tenant_id=who, text=INTENT, top_k=5)
                return await stub.ScoreTools(request, timeout=30)

            first = await score(tenant)
            assert app.snapshots.loaded() == [tenant]
            await score(other)
            assert app.snapshots.loaded() == [other]
            assert await score(tenant) == first
            assert app.snapshots.loaded() == [tenant]
    finally:
        await app.stop()
