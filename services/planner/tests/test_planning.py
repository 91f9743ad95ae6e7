"""A tenant's planning state: hyperedges from the graph, incremental sync, the three methods."""

from __future__ import annotations

from datetime import UTC, datetime

from pml_common.events import ExecutionCompleted, ExecutionStep
from pml_planner.graph_source import LinkInfo, NodeInfo, PlannerGraph
from pml_planner.outcomes import outcome_of
from pml_planner.planning import Candidate, TenantPlanner, chain_plan, hyperedges_of


def _graph(success_a: float | None = None, links: tuple[LinkInfo, ...] = ()) -> PlannerGraph:
    nodes = {t: NodeInfo(t, "tool", 0, None, None) for t in ("s:a", "s:b", "s:c", "s:x")}
    nodes["A"] = NodeInfo("A", "capability", 4, success_a, None)
    nodes["B"] = NodeInfo("B", "capability", 0, None, None)
    nodes["M"] = NodeInfo("M", "capability", 0, None, None)
    members = {"A": ("s:a", "s:b"), "B": ("s:c", "s:x"), "M": ("A", "B")}
    return PlannerGraph("t", nodes, members, links)


def test_hyperedges_cover_capabilities_declared_order_and_planning_links_only() -> None:
    links = (
        LinkInfo("s:b", "s:a", "sequence", "observed", 3, 0.5),
        LinkInfo("A", "s:a", "contains", "observed", 3, 0.8),
    )
    edges = hyperedges_of(_graph(links=links))
    assert edges["capability:A"].tail == frozenset({"s:a", "s:b"})
    assert edges["capability:M"].tail == frozenset({"A", "B"})
    assert "sequence:s:a->s:b" in edges  # declared order, as a template sequence
    assert edges["sequence:s:b->s:a"].cost == 2.0  # learned: 1 / (0.5 × 1.0)
    assert not any(e.startswith("contains:") for e in edges)


def test_a_guessed_link_costs_what_its_stored_weight_says() -> None:
    links = (
        LinkInfo("s:a", "s:c", "sequence", "inferred", 0, 0.5 * 0.7 * 0.4),  # cosine 0.4 guess
        LinkInfo("s:b", "s:c", "sequence", "observed", 3, 0.5),
        LinkInfo("s:x", "s:c", "dependency", "template", 0, 0.0),  # no weight stored
    )
    edges = hyperedges_of(_graph(links=links))
    assert abs(edges["sequence:s:a->s:c"].cost - 1 / (0.5 * 0.7 * 0.4)) < 1e-9
    assert edges["sequence:s:b->s:c"].cost == 2.0
    assert edges["dependency:s:x->s:c"].cost == 2.0  # 1 / (1.0 × 0.5): the nominal weight


def test_sync_changes_only_what_changed() -> None:
    planner = TenantPlanner.build(_graph())
    assert planner.sync(_graph()) == 0
    assert planner.sync(_graph(success_a=0.25)) == 1  # one reweighting
    assert planner.drdsp.graph.edge("capability:A").cost == 4.0


def test_sync_rebuilds_the_derived_structures_only_when_their_inputs_changed() -> None:
    link = LinkInfo("s:a", "s:c", "sequence", "inferred", 1, 0.35)
    planner = TenantPlanner.build(_graph(links=(link,)))
    discovery, legacy = planner.discovery(), planner.legacy()
    # A count that changes no weight, and a success rate: spectral clusters and Louvain stay.
    planner.sync(
        _graph(success_a=0.5, links=(LinkInfo("s:a", "s:c", "sequence", "inferred", 2, 0.35),))
    )
    assert planner.discovery() is discovery and planner.legacy() is legacy
    # A tool used since: the same communities, the recency term now knows it.
    used = _graph(links=(link,))
    used.nodes["s:c"] = NodeInfo("s:c", "tool", 1, 1.0, datetime(2026, 1, 1, tzinfo=UTC))
    planner.sync(used)
    assert planner.legacy().communities is legacy.communities
    assert planner.legacy().last_used == {"s:c": datetime(2026, 1, 1, tzinfo=UTC)}
    # A new link: Louvain and PageRank again; new members: the clusters again.
    planner.sync(_graph(links=(link, LinkInfo("s:b", "s:x", "sequence", "inferred", 1, 0.35))))
    assert planner.legacy() is not legacy and planner.discovery() is discovery
    grown = _graph()
    grown.members["B"] = ("s:c",)
    planner.sync(grown)
    assert planner.discovery() is not discovery


def test_dag_of_a_nested_capability_and_its_reliability() -> None:
    planner = TenantPlanner.build(_graph(success_a=0.5))
    plan = planner.suggest_dag(planner.target(Candidate("M", 0.8)))
    assert set(plan.nodes) == {"M", "A", "B", "s:a", "s:b", "s:c", "s:x"}
    assert plan.order[-1] == "M"
    assert plan.order.index("s:a") < plan.order.index("s:b")  # declared order
    assert abs(plan.confidence - 0.8 * 0.5) < 1e-9  # A's success rate 0.5, the others 1


def test_next_step_follows_the_target_dag_after_the_context() -> None:
    planner = TenantPlanner.build(_graph())
    plan = planner.predict_next(planner.target(Candidate("A", 0.9)), ["s:a"], k=3)
    # A's next tool, then the legacy heuristic's successors of s:a (none observed: the rest)
    assert [c.id for c in plan.candidates] == ["s:b", "s:c", "s:x"]
    assert plan.path[0] == "s:a" and plan.path[-1] == "A"
    cold = planner.predict_next(planner.target(Candidate("B", 0.9)), [], k=3)
    assert [c.id for c in cold.candidates] == ["s:c", "s:x"]
    assert cold.candidates[0].score > cold.candidates[1].score


def test_discovery_suggests_the_capability_the_context_overlaps() -> None:
    planner = TenantPlanner.build(_graph())
    plan = planner.discovery_next(["s:x"], {}, k=3)
    assert plan.target == "B"
    assert [c.id for c in plan.candidates] == ["s:c"]
    # Same overlap (one tool of two each): the intent's target score breaks the tie.
    tied = ["s:a", "s:c"]
    assert planner.discover(tied, {"B": 0.9, "A": 0.2}, 2)[0].id == "B"
    assert planner.discover(tied, {"A": 0.9, "B": 0.2}, 2)[0].id == "A"
    # A capability fully run gives way to the next one that still has steps.
    done = planner.discovery_next(["s:a", "s:b", "s:c"], {}, k=3)
    assert done.target == "B" and [c.id for c in done.candidates] == ["s:x"]
    assert planner.discovery_next(["s:unknown"], {}, k=3).candidates == ()


def test_legacy_chain_and_search_chain() -> None:
    links = (LinkInfo("s:a", "s:b", "sequence", "observed", 5, 0.5),)
    planner = TenantPlanner.build(_graph(links=links))
    assert planner.legacy_next(["s:a"], 1)[0].id == "s:b"
    assert planner.legacy_chain("s:a")[:2] == ["s:a", "s:b"]
    chain = chain_plan(["s:c", "s:a", "s:c"], 0.4)
    assert chain.nodes == ("s:c", "s:a") and chain.edges == (("s:c", "s:a", "order"),)


def test_outcomes_of_suggestions() -> None:
    def run(outcome: str, steps: list[tuple[str, bool]]) -> ExecutionCompleted:
        return ExecutionCompleted.create(
            intent="i",
            outcome=outcome,
            steps=[ExecutionStep(node_id=n, success=ok) for n, ok in steps],
            occurred_at=datetime.now(UTC),
        )

    assert outcome_of("next", ["s:b"], run("success", [("s:a", True), ("s:b", True)])) == "success"
    assert outcome_of("next", ["s:b"], run("failure", [("s:b", False)])) == "failure"
    assert outcome_of("next", ["s:b"], run("success", [("s:c", True)])) == "ignored"
    assert (
        outcome_of("dag", ["s:a", "s:b"], run("failure", [("s:a", True), ("s:b", False)]))
        == "failure"
    )
    assert outcome_of("dag", ["s:a", "s:b", "s:c"], run("success", [("s:x", True)])) == "ignored"


def test_a_context_that_contradicts_the_intents_first_target_moves_the_target() -> None:
    planner = TenantPlanner.build(_graph())
    intent = [Candidate("A", 0.9), Candidate("B", 0.6)]
    target = planner.choose_target(intent)
    assert target is not None and target.id == "A"  # the intent alone
    # The agent ran B's first tool: B holds the context, A none of it.
    moved = planner.choose_target(intent, ["s:c"])
    assert moved is not None and moved.id == "B"
    # A capability the intent did not rank at all is found through the tool it holds.
    found = planner.choose_target([Candidate("A", 0.9)], ["s:x"])
    assert found is not None and found.id == "B"
    # A target whose tools have all been run has nothing left to offer.
    done = planner.choose_target(intent, ["s:a", "s:b"])
    assert done is not None and done.id != "A"
    plan = planner.predict_next(moved, ["s:c"], k=3)
    assert plan.candidates[0].id == "s:x"


def test_the_next_step_falls_back_on_the_current_tools_observed_successors() -> None:
    links = (LinkInfo("s:b", "s:c", "sequence", "observed", 5, 0.5),)
    planner = TenantPlanner.build(_graph(links=links))
    target = planner.target(Candidate("A", 0.9))
    # A's plan is run to its end: what followed s:b in other executions comes next.
    plan = planner.predict_next(target, ["s:a", "s:b"], k=3)
    assert plan.candidates[0].id == "s:c"


def test_the_tools_a_hyperpath_requires_come_in_the_targets_order() -> None:
    nodes = {t: NodeInfo(t, "tool", 0, None, None) for t in ("s:build", "s:test", "s:ship")}
    nodes["release"] = NodeInfo("release", "capability", 0, None, None)
    graph = PlannerGraph("t", nodes, {"release": ("s:build", "s:test", "s:ship")}, ())
    planner = TenantPlanner.build(graph)
    plan = planner.predict_next(planner.target(Candidate("release", 0.9)), ["s:build"], k=3)
    # not alphabetical (s:ship < s:test): the release runs its tests before it ships
    assert [c.id for c in plan.candidates][:2] == ["s:test", "s:ship"]
