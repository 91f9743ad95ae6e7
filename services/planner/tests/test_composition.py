"""Workflows composed from a request's sub-goals when no stored capability fits."""

from __future__ import annotations

from pml_planner.composition import COMPOSED_EDGE, clauses_of, compose, pick_tools
from pml_planner.graph_source import NodeInfo, PlannerGraph
from pml_planner.planning import Candidate, TenantPlanner

CHAINED = "search the web for today's news, then send the summary by mail to the team"


def _planner() -> TenantPlanner:
    nodes = {t: NodeInfo(t, "tool", 0, None, None) for t in ("s:a", "s:b", "web:search", "m:send")}
    nodes["A"] = NodeInfo("A", "capability", 3, 1.0, None)
    return TenantPlanner.build(PlannerGraph("t", nodes, {"A": ("s:a", "s:b")}, ()))


def test_a_request_is_split_into_its_sub_goals_in_order() -> None:
    assert clauses_of(CHAINED) == [
        "search the web for today's news",
        "send the summary by mail to the team",
    ]
    assert clauses_of("list my repositories") == ["list my repositories"]
    assert clauses_of("在网上搜索今天的新闻，然后把摘要用邮件发给团队") == [
        "在网上搜索今天的新闻",
        "把摘要用邮件发给团队",
    ]


def test_each_clause_takes_its_best_tool_no_earlier_clause_took() -> None:
    ranked = [[Candidate("x", 0.9)], [Candidate("x", 0.8), Candidate("y", 0.5)], []]
    assert [c.id for c in pick_tools(ranked)] == ["x", "y"]


def test_a_task_whose_workflow_was_never_stored_gets_a_composed_dag() -> None:
    planner = _planner()
    target = planner.target(Candidate("A", 0.9))  # the intent's best, another task's workflow
    ranked = [[Candidate("web:search", 0.8)], [Candidate("m:send", 0.6)]]
    plan = compose(planner, target, ranked)
    assert plan.order == ("web:search", "m:send") and plan.target == ""
    assert plan.edges == (("web:search", "m:send", COMPOSED_EDGE),)
    assert plan.composed == ("web:search", "m:send")
    assert abs(plan.confidence - 0.7) < 1e-9


def test_a_learned_workflow_that_holds_the_request_is_kept_and_completed() -> None:
    planner = _planner()
    target = planner.target(Candidate("A", 0.9))
    plan = compose(planner, target, [[Candidate("s:a", 0.8)], [Candidate("m:send", 0.6)]])
    assert plan.target == "A" and {"s:a", "s:b", "A"} <= set(plan.nodes)
    assert plan.order[-1] == "m:send" and plan.composed == ("m:send",)
    assert ("A", "m:send", COMPOSED_EDGE) in plan.edges
    # everything the request asks is in the learned workflow: nothing composed
    whole = compose(planner, target, [[Candidate("s:b", 0.8)]])
    assert whole.composed == () and whole == planner.suggest_dag(target)
    # no sub-goal found a tool: the learned workflow alone
    assert compose(planner, target, []) == planner.suggest_dag(target)
    assert compose(planner, None, []).nodes == ()
