"""Prequential figures of the planning methods: the arithmetic, the choice rule, the store."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis

from pml_common.events import ExecutionCompleted, ExecutionStep
from pml_planner.blend import SEARCH_ONLY, VARIANTS, new_work, variant
from pml_planner.graph_source import LinkInfo, NodeInfo, PlannerGraph
from pml_planner.methods import METHODS, Inputs
from pml_planner.planning import Candidate, TenantPlanner
from pml_planner.prequential import (
    MIN_EVIDENCE,
    Choice,
    MethodFigures,
    PrequentialStore,
    Summary,
    blend_weights,
    choose,
    figures_of,
    judged_tools,
    margin,
    needs_of,
    node_f1,
)
from pml_planner.targets import Targets


def _planner() -> TenantPlanner:
    """Capability A runs s:a then s:b; executions went from s:a to s:c (a learned link)."""
    nodes = {t: NodeInfo(t, "tool", 0, None, None) for t in ("s:a", "s:b", "s:c")}
    nodes["A"] = NodeInfo("A", "capability", 0, None, None)
    links = (LinkInfo("s:a", "s:c", "sequence", "observed", 5, 1.0),)
    return TenantPlanner.build(PlannerGraph("t", nodes, {"A": ("s:a", "s:b")}, links))


def _inputs() -> Inputs:
    search = (Candidate("s:a", 0.9), Candidate("s:c", 0.8), Candidate("s:b", 0.7))
    return Inputs(Targets((Candidate("A", 0.9),), "search"), search)


def test_node_f1() -> None:
    assert node_f1(["s:a", "s:b"], ["s:b", "s:a"]) == 1.0
    assert node_f1(["s:a", "s:c", "s:b"], ["s:a", "s:b"]) == pytest.approx(0.8)
    assert node_f1(["s:a", "s:a"], ["s:a", "s:b"]) == pytest.approx(2 / 3)  # sets
    assert node_f1([], ["s:a"]) == 0.0
    assert node_f1(["s:x"], ["s:a"]) == 0.0


def test_each_method_is_judged_at_every_step_and_on_its_dag() -> None:
    figures = figures_of(_planner(), _inputs(), ["s:a", "s:b"])
    # DR-DSP plans A: s:a, then s:b; its DAG is A's, exactly the tools run.
    assert figures["drdsp"] == MethodFigures(2, 2, 2, 1, 1.0)
    # Search's order is s:a, s:c, s:b: s:b is second once s:a ran; its DAG adds s:c.
    assert figures["search"] == MethodFigures(2, 1, 2, 1, pytest.approx(0.8))
    # Legacy starts where search does, then follows the learned link s:a -> s:c.
    assert figures["legacy"].hits_at_1 == 1 and figures["legacy"].hits_at_3 == 2
    assert set(figures) == set(METHODS) | set(VARIANTS)
    # The blend at (0, 0) is search's order; it serves the pair it was given, with search's DAG.
    assert figures[variant(SEARCH_ONLY)] == MethodFigures(2, 1, 2)
    assert figures["blend"] == figures["search"]
    served = figures_of(_planner(), _inputs(), ["s:a", "s:b"], weights=(0.0, 2.0))
    # With the hyperpath weighed 2, s:b (A's next step) comes before search's s:c.
    assert served["blend"] == MethodFigures(2, 2, 2, 1, pytest.approx(0.8))
    assert served[variant((0.0, 2.0))].hits_at_1 == 2
    assert not any(name.endswith("/new") for name in served)
    new = figures_of(_planner(), _inputs(), ["s:a", "s:b"], new_work=True)
    assert new[new_work(variant((0.0, 2.0)))] == new[variant((0.0, 2.0))]
    assert all(new[new_work(m)] == new[m] for m in METHODS)


def test_the_blend_serves_the_weights_its_figures_on_new_work_earned() -> None:
    n = 100  # margin 1/√100 = 0.1
    found = {new_work(v): MethodFigures(n, 40) for v in VARIANTS}
    found |= {v: MethodFigures(3 * n, 100) for v in VARIANTS}
    assert blend_weights(Summary(found)) == SEARCH_ONLY  # every pair ties: search's order
    found[new_work(variant((0.5, 1.0)))] = MethodFigures(n, 49)
    assert blend_weights(Summary(found)) == SEARCH_ONLY  # +9 points: within the margin
    found[new_work(variant((1.0, 2.0)))] = MethodFigures(n, 51)
    found[new_work(variant((2.0, 2.0)))] = MethodFigures(n, 51)
    assert blend_weights(Summary(found)) == (1.0, 2.0)  # +11: the lighter of the two best
    # Far better on all runs, no better on new work: no weight.
    found[variant((0.0, 1.0))] = MethodFigures(3 * n, 3 * n)
    assert blend_weights(Summary(found)) == (1.0, 2.0)
    short = {v: MethodFigures(MIN_EVIDENCE - 1, f.hits_at_1) for v, f in found.items()}
    assert blend_weights(Summary(short)) == SEARCH_ONLY


def test_judged_tools_are_the_known_tools_in_first_run_order() -> None:
    event = ExecutionCompleted.create(
        tenant_id="t",
        intent="x",
        steps=[
            ExecutionStep(node_id=n, success=True) for n in ("s:b", "s:unknown", "A", "s:a", "s:b")
        ],
        outcome="success",
    )
    assert judged_tools(_planner(), event) == ["s:b", "s:a"]


def test_one_fetch_covers_every_method_and_step() -> None:
    needs = needs_of(["s:a", "s:b", "s:c"])
    # Search's next step after 2 tools needs 5 more than those: 7; DR-DSP the capabilities.
    assert needs.capabilities and needs.tools == 7


def _summary(
    next_hits: dict[str, int],
    f1: dict[str, float],
    n: int,
    new_work_hits: dict[str, int] | None = None,
) -> Summary:
    """Figures of every method, the same on new work (n judged there too) unless its hits are
    given; the blend's are search's unless given (its weights at 0)."""

    def figures(hits: dict[str, int]) -> dict[str, MethodFigures]:
        hits = {"blend": hits.get("search", 0), **hits}
        return {m: MethodFigures(n, hits.get(m, 0), 0, n, f1.get(m, 0.0) * n) for m in METHODS}

    on_new_work = figures(next_hits if new_work_hits is None else new_work_hits)
    return Summary(figures(next_hits) | {new_work(m): f for m, f in on_new_work.items()})


def test_the_best_method_is_chosen_once_every_method_has_enough_evidence() -> None:
    # legacy beats search's order by 15/20 - 0 = 0.75, beyond the margin of 1/√20
    figures = _summary({"drdsp": 10, "legacy": 15}, {"search": 0.9, "drdsp": 0.5}, MIN_EVIDENCE)
    assert choose(figures, "next").method == "legacy"
    assert choose(figures, "next").source == "prequential"
    assert choose(figures, "dag").method == "search"

    short = _summary({"drdsp": 10, "legacy": 15}, {"search": 0.9}, MIN_EVIDENCE - 1)
    assert choose(short, "next").method == "drdsp"
    assert choose(short, "next").source == "default"

    # One method short of evidence is enough to keep the default.
    partial = dict(figures.methods)
    partial["discovery"] = MethodFigures(MIN_EVIDENCE - 1, 0, 0, MIN_EVIDENCE - 1, 0.0)
    assert choose(Summary(partial), "next") == choose(short, "next")


def test_the_zero_shot_methods_stay_unless_beaten_beyond_the_margin() -> None:
    n = 400  # margin 1/√400 = 0.05
    tied = _summary({"drdsp": 200, "legacy": 200, "search": 200}, {}, n)
    assert choose(tied, "next") == Choice("blend", "prequential")  # the next step's zero-shot
    assert choose(tied, "dag") == Choice("search", "prequential")
    within = _summary({"drdsp": 219, "search": 200}, {"drdsp": 0.54, "search": 0.5}, n)
    assert choose(within, "next").method == "blend"
    assert choose(within, "dag").method == "search"
    beyond = _summary({"drdsp": 221, "search": 200}, {"drdsp": 0.56, "search": 0.5}, n)
    assert choose(beyond, "next").method == "drdsp"
    assert choose(beyond, "dag").method == "drdsp"
    assert margin(n) == pytest.approx(0.05)


def test_a_method_worse_on_new_work_does_not_replace_the_zero_shot_one() -> None:
    n = 400
    # DR-DSP beats search's order on all runs (the repeated work of capabilities it recalls).
    repeated = {"drdsp": 300, "search": 200}
    better = _summary(repeated, {}, n, new_work_hits={"drdsp": 101, "search": 100})
    assert choose(better, "next").method == "drdsp"
    tied = _summary(repeated, {}, n, new_work_hits={"drdsp": 100, "search": 100})
    assert choose(tied, "next").method == "drdsp"  # not worse: enough
    worse = _summary(repeated, {}, n, new_work_hits={"drdsp": 99, "search": 100})
    assert choose(worse, "next") == Choice("blend", "prequential")
    # Too little new work to tell: the zero-shot method stays.
    short = dict(better.methods)
    short[new_work("drdsp")] = MethodFigures(MIN_EVIDENCE - 1, MIN_EVIDENCE - 1)
    assert choose(Summary(short), "next").method == "blend"


def test_ties_between_the_others_keep_drdsp() -> None:
    tied = _summary({"drdsp": 12, "legacy": 12, "search": 1}, {}, MIN_EVIDENCE)
    assert choose(tied, "next").method == "drdsp"
    others = _summary({"drdsp": 1, "discovery": 12, "legacy": 12}, {}, MIN_EVIDENCE)
    assert choose(others, "next").method == "legacy"  # then the earlier of METHODS


async def test_the_store_adds_executions_and_is_deleted_with_the_tenant(
    redis: Redis, tenant: str
) -> None:
    store = PrequentialStore(redis)
    one = {"drdsp": MethodFigures(2, 1, 2, 1, 0.5), "legacy": MethodFigures(2, 2, 2, 1, 0.25)}
    await store.record(tenant, one)
    await store.record(tenant, one)
    await store.record(tenant, {})  # skipped
    summary = await store.summary(tenant)
    assert summary.executions == 2 and summary.skipped == 1
    assert summary.figures("drdsp") == MethodFigures(4, 2, 4, 2, 1.0)
    assert summary.figures("legacy").next_hit_at_1 == 1.0
    assert summary.figures("legacy").mean_node_f1 == pytest.approx(0.25)
    assert summary.figures("search") == MethodFigures()
    assert (await store.summary(f"{tenant}-other")).executions == 0

    await store.delete_tenant(tenant)
    assert await store.summary(tenant) == await store.summary(f"{tenant}-other")
