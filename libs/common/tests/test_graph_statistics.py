"""Pure statistics: ADR-038 §2.3 weights, promotion at 3, what an execution changes."""

from __future__ import annotations

from typing import Any

import pytest

from pml_common.events import ExecutionCompleted, ExecutionStep
from pml_common.graph_statistics import (
    PROMOTION_THRESHOLD,
    EdgeKey,
    EdgeState,
    NodeUpdate,
    edge_weight,
    execution_effect,
    merge_cold_start,
    observe,
    success_rate,
)


def run(*steps: ExecutionStep, outcome: str = "success", **kw: Any) -> ExecutionCompleted:
    return ExecutionCompleted.create(intent="do it", steps=list(steps), outcome=outcome, **kw)


def step(node: str, ok: bool = True, deps: tuple[str, ...] = ()) -> ExecutionStep:
    return ExecutionStep(node_id=node, success=ok, depends_on=list(deps))


@pytest.mark.parametrize(
    ("edge_type", "source", "expected"),
    [
        ("dependency", "observed", 1.0),
        ("dependency", "inferred", 0.7),
        ("dependency", "template", 0.5),
        ("contains", "observed", 0.8),
        ("contains", "inferred", 0.56),
        ("contains", "template", 0.4),
        ("sequence", "observed", 0.5),
        ("sequence", "inferred", 0.35),
        ("sequence", "template", 0.25),
    ],
)
def test_weight_is_type_times_source(edge_type: str, source: str, expected: float) -> None:
    assert edge_weight(edge_type, source) == pytest.approx(expected)


def test_weight_scales_by_cold_start_factor() -> None:
    assert edge_weight("sequence", "inferred", 0.5) == pytest.approx(0.175)
    assert EdgeState("inferred", "similarity", 0, 0.92).weight("sequence") == pytest.approx(
        0.5 * 0.7 * 0.92
    )


def test_success_rate() -> None:
    assert success_rate(3, 4) == 0.75
    assert success_rate(0, 0) is None


def test_new_edge_is_inferred_and_promoted_exactly_at_third_observation() -> None:
    assert PROMOTION_THRESHOLD == 3
    first = observe(None)
    assert (first.source, first.origin, first.count) == ("inferred", "execution", 1)
    second = observe(first)
    assert (second.source, second.count) == ("inferred", 2)
    third = observe(second)
    assert (third.source, third.count) == ("observed", 3)
    assert third.weight("sequence") == pytest.approx(0.5)
    assert observe(third).source == "observed"


def test_template_edge_counts_observations_and_is_promoted_the_same_way() -> None:
    state = EdgeState("template", "template", 0)
    state = observe(observe(state))
    assert (state.source, state.count, state.origin) == ("template", 2, "template")
    state = observe(state)
    assert (state.source, state.count) == ("observed", 3)


def test_observation_replaces_the_similarity_factor() -> None:
    guess = EdgeState("inferred", "similarity", 0, factor=0.91)
    seen = observe(guess)
    assert (seen.source, seen.count, seen.factor) == ("inferred", 1, 1.0)
    assert seen.weight("sequence") == pytest.approx(0.35)


def test_cold_start_never_touches_evidence() -> None:
    template = EdgeState("template", "template", 0)
    assert merge_cold_start(None, template) == template
    assert merge_cold_start(EdgeState("inferred", "execution", 1), template) is None
    assert merge_cold_start(EdgeState("observed", "execution", 5), template) is None


def test_cold_start_keeps_the_heavier_guess() -> None:
    template = EdgeState("template", "template", 0)  # 0.5
    similar = EdgeState("inferred", "similarity", 0, 0.93)  # 0.651
    same_server = EdgeState("inferred", "same_server", 0, 0.5)  # 0.35
    assert merge_cold_start(template, similar) == similar
    assert merge_cold_start(similar, template) is None
    assert merge_cold_start(same_server, template) == template
    assert merge_cold_start(similar, similar) is None  # re-running changes nothing


def test_step_outcomes_count_per_call_including_failures() -> None:
    effect = execution_effect(
        run(step("fs:read"), step("fs:write", ok=False), step("fs:read"), outcome="partial")
    )
    assert set(effect.step_updates) == {
        NodeUpdate("fs:read", executions=2, successes=2),
        NodeUpdate("fs:write", executions=1, successes=0),
    }
    assert effect.capability_update is None


@pytest.mark.parametrize(("outcome", "successes"), [("success", 1), ("partial", 0), ("failure", 0)])
def test_capability_gets_the_run_outcome(outcome: str, successes: int) -> None:
    effect = execution_effect(run(step("a:x"), outcome=outcome, capability_id="cap-1"))
    assert effect.capability_update == NodeUpdate("cap-1", 1, successes)
    assert effect.node_ids == ["a:x", "cap-1"]


def test_sequence_dependency_and_contains_edges() -> None:
    effect = execution_effect(
        run(
            step("a:x"),
            step("a:y", deps=("a:x",)),
            step("b:z", deps=("a:x", "a:y")),
            capability_id="cap",
        )
    )
    assert effect.edges == (
        EdgeKey("a:x", "a:y", "sequence"),
        EdgeKey("a:y", "b:z", "sequence"),
        EdgeKey("a:x", "a:y", "dependency"),
        EdgeKey("a:x", "b:z", "dependency"),
        EdgeKey("a:y", "b:z", "dependency"),
        EdgeKey("cap", "a:x", "contains"),
        EdgeKey("cap", "a:y", "contains"),
        EdgeKey("cap", "b:z", "contains"),
    )


def test_edges_are_counted_once_per_run_and_self_loops_dropped() -> None:
    effect = execution_effect(run(step("a:x"), step("a:y"), step("a:x"), step("a:y"), step("a:y")))
    assert effect.edges == (EdgeKey("a:x", "a:y", "sequence"), EdgeKey("a:y", "a:x", "sequence"))


def test_dependencies_on_later_or_unknown_steps_are_ignored() -> None:
    effect = execution_effect(run(step("a:x", deps=("a:y",)), step("a:y", deps=("a:y", "q:q"))))
    assert [e for e in effect.edges if e.type == "dependency"] == []
