"""The planner's event handlers on the suite's real Redis and Neo4j."""

from __future__ import annotations

import grpc
import neo4j
from redis.asyncio import Redis

from pml.v1 import scorer_pb2_grpc, search_pb2_grpc
from pml_common.events import ExecutionCompleted, ExecutionStep, GraphChanged, TenantDeleted
from pml_common.local_runtime import free_port
from pml_common.settings import Settings
from pml_planner.consumers import PlannerConsumers
from pml_planner.methods import METHODS
from pml_planner.outcomes import SuggestionMemory
from pml_planner.prequential import Judge, PrequentialStore
from pml_planner.targets import TargetSource
from pml_planner.tenants import TenantPlanners
from pml_planner.thresholds import RedisThresholdStore

from .helpers import StandIns, write_graph


def _consumers(
    redis: Redis,
    graph_db: neo4j.AsyncDriver,
    settings: Settings,
    targets: TargetSource,
    planners: TenantPlanners | None = None,
) -> tuple[PlannerConsumers, SuggestionMemory, RedisThresholdStore, PrequentialStore]:
    thresholds = RedisThresholdStore(redis)
    memory = SuggestionMemory(redis, thresholds)
    planners = planners or TenantPlanners(graph_db, settings.neo4j_database)
    figures = PrequentialStore(redis)
    consumers = PlannerConsumers(planners, memory, Judge(planners, targets, figures), figures)
    return consumers, memory, thresholds, figures


def _run(tenant: str, intent: str, *tools: str, ok: bool = True) -> ExecutionCompleted:
    return ExecutionCompleted.create(
        tenant_id=tenant,
        intent=intent,
        steps=[ExecutionStep(node_id=t, success=ok) for t in tools],
        outcome="success" if ok else "failure",
    )


async def test_a_deleted_tenant_takes_its_thresholds_suggestions_and_figures_along(
    redis: Redis,
    graph_db: neo4j.AsyncDriver,
    settings: Settings,
    tenant: str,
    stand_ins: StandIns,
) -> None:
    consumers, memory, thresholds, figures = _consumers(
        redis, graph_db, settings, stand_ins.targets
    )
    other = f"{tenant}-other"
    for who in (tenant, other):
        await memory.remember(who, "ship it", "next", "drdsp:next", 0.8, ["s:a"])
        await memory.remember(who, "deploy", "dag", "drdsp:dag", 0.7, ["s:a", "s:b"])
    # one suggestion followed, so the tenant has a learned threshold too (and, its tools
    # unknown to its planner, a skipped execution)
    await consumers.on_execution_completed(_run(tenant, "ship it", "s:a", ok=False))
    assert await thresholds.all_contexts(tenant)
    assert (await figures.summary(tenant)).skipped == 1
    for who in (tenant, other):
        assert not await figures.ran_before(who, ["s:a", "s:b"])
        await figures.record(who, {}, ["s:a", "s:b"])
        assert await figures.ran_before(who, ["s:b", "s:a"])  # the same set of tools
        assert not await figures.ran_before(who, ["s:a"])

    assert await redis.exists(f"pml:planner:judged:{tenant}") == 1  # what its run taught
    await consumers.on_tenant_deleted(TenantDeleted.create(tenant_id=tenant))

    assert await thresholds.all_contexts(tenant) == {}
    assert await redis.exists(f"pml:planner:suggestions:{tenant}") == 0
    assert await redis.exists(f"pml:planner:suggestions:{other}") == 1
    assert await redis.exists(f"pml:planner:prequential:{tenant}") == 0
    assert await redis.exists(f"pml:planner:runs:{tenant}") == 0
    assert await redis.exists(f"pml:planner:judged:{tenant}") == 0
    assert await redis.exists(f"pml:planner:runs:{other}") == 1


async def test_an_execution_is_judged_by_every_method_before_thresholds_learn(
    redis: Redis,
    graph_db: neo4j.AsyncDriver,
    settings: Settings,
    tenant: str,
    stand_ins: StandIns,
) -> None:
    await write_graph(graph_db, tenant, {"release": ["s:build", "s:ship"]})
    stand_ins.rank(["s:build", "s:ship", "s:other"], ["release"])
    consumers, memory, thresholds, figures = _consumers(
        redis, graph_db, settings, stand_ins.targets
    )
    await memory.remember(tenant, "release it", "next", "search:next", 0.8, ["s:build"])

    await consumers.on_execution_completed(
        _run(tenant, "release it", "s:build", "s:unknown", "s:ship", "s:build")
    )

    summary = await figures.summary(tenant)
    assert (summary.executions, summary.skipped) == (1, 0)
    for method in METHODS:  # two distinct tools the planner knows: two predictions each
        assert (summary.figures(method).predictions, summary.figures(method).dags) == (2, 1)
    # Search's order is the run's: both steps first, and its DAG holds one tool too many.
    assert summary.figures("search").hits_at_1 == 2
    assert abs(summary.figures("search").mean_node_f1 - 0.8) < 1e-9
    # The first run of {build, ship} is new work: judged without `release`, which runs exactly
    # those tools, DR-DSP composes its DAG from search's best tool for the request (F1 2/3).
    assert abs(summary.figures("drdsp").mean_node_f1 - 2 / 3) < 1e-9
    # One fetch per kind for the whole execution (the request is its own single sub-goal, so
    # its tools serve composition too), every method and step computed in-process.
    assert len(stand_ins.rankings.requests) == 2
    assert await thresholds.all_contexts(tenant)  # the remembered suggestion was learned

    # Run again, the same tools are work already run: `release`'s DAG is the answer (F1 1).
    await consumers.on_execution_completed(_run(tenant, "release it", "s:build", "s:ship"))
    again = (await figures.summary(tenant)).figures("drdsp")
    assert again.dags == 2 and abs(again.node_f1 - (2 / 3 + 1.0)) < 1e-9


async def test_search_failing_skips_the_figures_not_the_learning(
    redis: Redis, graph_db: neo4j.AsyncDriver, settings: Settings, tenant: str
) -> None:
    await write_graph(graph_db, tenant, {"release": ["s:build", "s:ship"]})
    nowhere = grpc.aio.insecure_channel(f"127.0.0.1:{free_port()}")
    try:
        targets = TargetSource(
            scorer_pb2_grpc.ScorerServiceStub(nowhere),
            search_pb2_grpc.SearchServiceStub(nowhere),
            timeout_s=2.0,
        )
        consumers, memory, thresholds, figures = _consumers(redis, graph_db, settings, targets)
        await memory.remember(tenant, "release it", "next", "drdsp:next", 0.8, ["s:build"])

        await consumers.on_execution_completed(_run(tenant, "release it", "s:build", "s:ship"))
    finally:
        await nowhere.close()

    assert await thresholds.all_contexts(tenant)
    summary = await figures.summary(tenant)
    assert (summary.executions, summary.skipped, summary.unjudged) == (0, 0, 1)


async def test_an_execution_judged_but_never_recorded_is_still_new_work_when_redelivered(
    redis: Redis,
    graph_db: neo4j.AsyncDriver,
    settings: Settings,
    tenant: str,
    stand_ins: StandIns,
) -> None:
    await write_graph(graph_db, tenant, {"release": ["s:build", "s:ship"]})
    stand_ins.rank(["s:build", "s:ship", "s:other"], ["release"])
    planners = TenantPlanners(graph_db, settings.neo4j_database)
    figures = PrequentialStore(redis)
    judge = Judge(planners, stand_ins.targets, figures)
    event = _run(tenant, "release it", "s:build", "s:ship")

    failed = await judge.judge(event)  # a delivery that fails before its figures are written
    redelivered = await judge.judge(event)
    assert failed is not None and redelivered == failed
    # new work: judged without `release`, DR-DSP composes from search's best tool (F1 2/3)
    assert abs(redelivered.figures["drdsp"].node_f1 - 2 / 3) < 1e-9

    await figures.record(tenant, redelivered.figures, redelivered.tools)
    after = await judge.judge(event)  # the same tools once recorded: work already run
    assert after is not None and after.figures["drdsp"].node_f1 == 1.0


async def test_the_judge_plans_without_what_the_trainer_learned_from_runs_not_yet_judged(
    redis: Redis,
    graph_db: neo4j.AsyncDriver,
    settings: Settings,
    tenant: str,
    stand_ins: StandIns,
) -> None:
    await write_graph(graph_db, tenant, {"other": ["s:build", "s:lint"], "more": ["s:ship"]})
    # The trainer, on its own consumer group, already learned build → ship from this run and
    # two later ones (promoted to observed), and told the planner.
    await graph_db.execute_query(
        """
        MATCH (a:Tool {tenant_id: $tenant, id: 's:build'}), (b:Tool {tenant_id: $tenant, id: 's:ship'})
        CREATE (a)-[:LINK {type: 'sequence', source: 'observed', origin: 'execution',
                           count: 3, factor: 1.0, weight: 1.0}]->(b)
        """,
        tenant=tenant,
    )
    stand_ins.rank(["s:lint", "s:build", "s:ship"])
    planners = TenantPlanners(graph_db, settings.neo4j_database)
    figures = PrequentialStore(redis)
    judge = Judge(planners, stand_ins.targets, figures, view_runs=2)
    served = await planners.get(tenant)
    assert [c.id for c in served.legacy_next(["s:build"], 1)] == ["s:ship"]
    event = _run(tenant, "release it", "s:build", "s:ship")

    first = await judge.judge(event)

    # Judged on the graph as the runs judged before it made it: no build → ship yet, so the
    # transitions cannot recall the run's second step (the served graph would have).
    assert first is not None
    assert first.figures["legacy"].hits_at_1 == 0
    await figures.record(tenant, first.figures, first.tools, taught=event)
    # The judge's view is made again every 2 judged runs: one run later it is still the first.
    again = _run(tenant, "release it", "s:build", "s:ship")
    second = await judge.judge(again)
    assert second is not None and second.figures["legacy"].hits_at_1 == 0
    await figures.record(tenant, second.figures, second.tools, taught=again)
    third = await judge.judge(_run(tenant, "release it", "s:build", "s:ship"))
    # Two runs judged: their transition is known to the judge's graph (two observations).
    assert third is not None
    assert third.figures["legacy"].hits_at_1 == 1


async def test_the_changes_of_one_read_refresh_each_tenant_once(
    redis: Redis, graph_db: neo4j.AsyncDriver, settings: Settings, tenant: str, stand_ins: StandIns
) -> None:
    refreshed: list[str] = []

    class Counted(TenantPlanners):
        async def refresh(self, tenant: str) -> None:
            refreshed.append(tenant)
            await super().refresh(tenant)

    await write_graph(graph_db, tenant, {"release": ["s:build"]})
    planners = Counted(graph_db, settings.neo4j_database)
    consumers, *_ = _consumers(redis, graph_db, settings, stand_ins.targets, planners)
    assert (await planners.get(tenant)).is_tool("s:build")
    await write_graph(graph_db, tenant, {"ship": ["s:ship"]})
    other = f"{tenant}-other"
    changes = [GraphChanged.create(tenant_id=t, reason="test") for t in (tenant, other, tenant)]

    await consumers.on_graph_changed(changes)

    assert refreshed == [tenant, other]
    assert (await planners.get(tenant)).is_tool("s:ship")  # brought up to date
