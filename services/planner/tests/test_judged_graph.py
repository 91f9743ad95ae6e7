"""The judge's view of the graph: what executions teach comes from the runs judged so far."""

from __future__ import annotations

from datetime import UTC, datetime

from pml_common.edge_weights import edge_weight
from pml_common.events import ExecutionCompleted, ExecutionStep
from pml_common.graph_statistics import EdgeKey
from pml_planner.graph_source import LinkInfo, NodeInfo, PlannerGraph
from pml_planner.judged_graph import RunTally, as_judged, increments

AT = datetime(2026, 1, 2, tzinfo=UTC)


def _graph(*links: LinkInfo) -> PlannerGraph:
    nodes = {
        t: NodeInfo(t, "tool", executions=9, success_rate=0.5, last_used_at=AT)
        for t in ("s:a", "s:b", "s:c")
    }
    return PlannerGraph("t", nodes, {}, links)


def _tally(*events: ExecutionCompleted) -> RunTally:
    """The tally as the store keeps it: increments summed, last-used times overwritten."""
    fields: dict[str, float] = {}
    for event in events:
        counts, used = increments(event)
        for name, n in counts.items():
            fields[name] = fields.get(name, 0) + n
        fields |= used
    return RunTally.from_fields({k: str(v) for k, v in fields.items()})


def _run(*tools: str, ok: bool = True) -> ExecutionCompleted:
    return ExecutionCompleted.create(
        tenant_id="t",
        intent="x",
        steps=[ExecutionStep(node_id=t, success=ok) for t in tools],
        outcome="success" if ok else "failure",
        occurred_at=AT,
    )


def test_links_only_unjudged_runs_taught_are_gone_and_judged_ones_count() -> None:
    learned = LinkInfo("s:a", "s:b", "sequence", "observed", 5, 1.0)
    view = as_judged(_graph(learned), RunTally())
    assert view.links == ()
    view = as_judged(_graph(learned), _tally(_run("s:a", "s:b")))
    (link,) = view.links
    assert (link.source, link.count) == ("inferred", 1)
    assert link.weight == edge_weight("sequence", "inferred")


def test_three_judged_runs_promote_an_edge_the_graph_does_not_hold_yet() -> None:
    view = as_judged(_graph(), _tally(*[_run("s:b", "s:c")] * 3))
    (link,) = view.links
    assert (link.src, link.dst, link.source, link.count) == ("s:b", "s:c", "observed", 3)


def test_a_cold_start_guess_stays_a_guess_until_judged_runs_observe_it() -> None:
    weight = edge_weight("sequence", "inferred", 0.4)  # as the trainer stores a cosine 0.4 guess
    guess = LinkInfo("s:a", "s:c", "sequence", "inferred", 0, weight, "similarity", 0.4)
    (kept,) = as_judged(_graph(guess), RunTally()).links
    assert kept == guess
    observed_since = LinkInfo("s:a", "s:c", "sequence", "observed", 3, 1.0, "template", 1.0)
    (back,) = as_judged(_graph(observed_since), RunTally()).links
    assert (back.source, back.count, back.origin) == ("template", 0, "template")


def test_node_statistics_are_the_judged_runs() -> None:
    view = as_judged(_graph(), _tally(_run("s:a", ok=False), _run("s:a")))
    assert view.nodes["s:a"].executions == 2
    assert view.nodes["s:a"].success_rate == 0.5
    assert view.nodes["s:a"].last_used_at == AT
    assert view.nodes["s:b"].executions == 0
    assert view.nodes["s:b"].success_rate is None and view.nodes["s:b"].last_used_at is None


def test_the_tally_reads_back_what_the_runs_observed() -> None:
    tally = _tally(_run("s:a", "s:b", "s:a"), _run("s:a", "s:b"))
    assert tally.edges == {
        EdgeKey("s:a", "s:b", "sequence"): 2,
        EdgeKey("s:b", "s:a", "sequence"): 1,
    }
    assert tally.nodes["s:a"].executions == 3
