"""The methods on fetched inputs: what each needs, and that inputs fetched once for all of them
(the prequential evaluation) give the answers a request's own fetch gives."""

from __future__ import annotations

from dataclasses import replace

from pml.v1 import search_pb2
from pml_planner import methods
from pml_planner.graph_source import LinkInfo, NodeInfo, PlannerGraph
from pml_planner.methods import METHODS, Inputs, Needs
from pml_planner.planning import Candidate, TenantPlanner
from pml_planner.prequential import needs_of
from pml_planner.targets import Targets

from .helpers import StandIns

SEARCH_ORDER = ("s:c", "s:a", "s:d", "s:b", "s:e", "s:f", "s:g", "s:h")
#: Search's best tools for each of the request's sub-goals, in the order it states them: the
#: request as a whole ranks s:c first, but its first sub-goal is s:d's.
CLAUSE_ORDER = (("s:d", "s:c"), ("s:h",), ("s:a", "s:c"))
CLAUSE_ORDER_TWO = ((Candidate("s:a", 0.9),), (Candidate("s:c", 0.9),))


def _planner() -> TenantPlanner:
    tools = ("s:a", "s:b", "s:c", "s:d", "s:e", "s:f", "s:g", "s:h")
    nodes = {t: NodeInfo(t, "tool", 0, None, None) for t in tools}
    nodes["A"] = NodeInfo("A", "capability", 0, None, None)
    nodes["B"] = NodeInfo("B", "capability", 0, None, None)
    members = {"A": ("s:a", "s:b", "s:c"), "B": ("s:d", "s:e")}
    links = (LinkInfo("s:b", "s:d", "sequence", "observed", 3, 1.0),)
    return TenantPlanner.build(PlannerGraph("t", nodes, members, links))


def _inputs(needs: Needs) -> Inputs:
    targets = Targets((Candidate("B", 0.6), Candidate("A", 0.5)), "search")
    tools = tuple(Candidate(t, 1.0 - 0.1 * i) for i, t in enumerate(SEARCH_ORDER[: needs.tools]))
    clauses = tuple(tuple(Candidate(t, 0.9) for t in c) for c in CLAUSE_ORDER)
    return Inputs(
        targets if needs.capabilities else methods.NO_TARGETS,
        tools,
        clauses if needs.clauses else (),
    )


def test_inputs_fetched_once_for_all_give_each_request_its_own_answer() -> None:
    planner = _planner()
    run = ["s:a", "s:b", "s:d"]
    shared = _inputs(needs_of(run))
    for method in METHODS:
        for i in range(len(run)):
            own = _inputs(methods.next_needs(method, run[:i]))
            assert methods.predict_next(method, planner, own, run[:i]) == methods.predict_next(
                method, planner, shared, run[:i]
            ), (method, i)
        own = _inputs(methods.dag_needs(method))
        assert methods.suggest_dag(method, planner, own) == methods.suggest_dag(
            method, planner, shared
        ), method


def test_the_first_step_is_the_one_the_request_states_first() -> None:
    planner = _planner()
    for method in ("search", "legacy", "discovery"):
        first = methods.predict_next(method, planner, _inputs(methods.next_needs(method, [])), [])
        # of search's five, the best of the first sub-goal, then of the third; s:h (best of
        # the second) is not among search's five
        assert [c.id for c in first.candidates] == ["s:d", "s:a", "s:c", "s:b", "s:e"], method
    # once a step has run, search's order without it
    later = methods.predict_next(
        "search", planner, _inputs(methods.next_needs("search", ["s:d"])), ["s:d"]
    )
    assert [c.id for c in later.candidates] == ["s:c", "s:a", "s:b", "s:e", "s:f"]


def test_search_chains_one_tool_per_stated_sub_goal_in_the_stated_order() -> None:
    planner = _planner()
    three = methods.suggest_dag("search", planner, _inputs(methods.dag_needs("search")))
    assert methods.dag_tools(planner, three) == ["s:d", "s:a", "s:c"]
    two = replace(_inputs(methods.dag_needs("search")), clause_tools=CLAUSE_ORDER_TWO)
    assert methods.dag_tools(planner, methods.suggest_dag("search", planner, two)) == [
        "s:a",
        "s:c",
    ]
    # a request stating no sub-goals is its own clause: search's first three, in its order
    one = replace(two, clause_tools=(two.tools[:3],))
    assert methods.dag_tools(planner, methods.suggest_dag("search", planner, one)) == [
        "s:c",
        "s:a",
        "s:d",
    ]


def test_what_each_method_needs() -> None:
    assert methods.next_needs("legacy", ["s:a"]) == Needs()
    assert methods.next_needs("legacy", []) == Needs(tools=methods.NEXT_CANDIDATES, clauses=True)
    assert methods.next_needs("search", []) == Needs(tools=methods.NEXT_CANDIDATES, clauses=True)
    assert methods.next_needs("search", ["s:a", "s:b", "s:a"]) == Needs(tools=7)
    assert methods.next_needs("drdsp", []) == Needs(capabilities=True)
    assert methods.dag_needs("discovery") == Needs(capabilities=True, tools=1)


async def test_fetch_asks_only_what_is_needed(stand_ins: StandIns) -> None:
    stand_ins.rank(["s:a", "s:b", "s:c"], ["A"])
    assert await methods.fetch(stand_ins.targets, "t", "x", Needs()) == Inputs()
    assert not stand_ins.rankings.requests

    fetched = await methods.fetch(stand_ins.targets, "t", "x", Needs(capabilities=True, tools=2))
    assert [c.id for c in fetched.tools] == ["s:a", "s:b"]
    assert [c.id for c in fetched.targets.candidates] == ["A"]  # untrained scorer: search's
    kinds = sorted(r.kinds[0] for r in stand_ins.rankings.requests)
    assert kinds == sorted([search_pb2.NODE_KIND_TOOL, search_pb2.NODE_KIND_CAPABILITY])
