import pytest

from pml_cli.plan_metrics import (
    PlanMetrics,
    chain_edges,
    dag_tool_edges,
    edge_f1,
    f1,
    hit_at,
    next_step_cases,
    node_f1,
)

TOOLS = {"a", "b", "c", "d", "x"}


def test_next_step_cases_cover_every_prefix() -> None:
    assert next_step_cases(["a", "b", "c"]) == [([], "a"), (["a"], "b"), (["a", "b"], "c")]
    assert next_step_cases([]) == []


def test_hit_at_k() -> None:
    assert hit_at(["a", "b", "c"], "a", 1) == 1.0
    assert hit_at(["x", "b", "c"], "c", 1) == 0.0
    assert hit_at(["x", "b", "c"], "c", 3) == 1.0
    assert hit_at([], "a", 3) == 0.0


def test_f1_hand_cases() -> None:
    assert f1({"a", "b"}, {"a", "b"}) == 1.0
    # P = {a, x}, G = {a, b, c}: precision 1/2, recall 1/3 → F1 = 2·1 / (2 + 3) = 0.4
    assert f1({"a", "x"}, {"a", "b", "c"}) == pytest.approx(0.4)
    assert f1(set(), {"a"}) == 0.0
    assert f1({"a"}, set()) == 0.0
    assert f1(set(), set()) == 1.0


def test_node_f1_ignores_capability_nodes() -> None:
    nodes = ["cap:abc", "a", "b", "x"]
    # tool nodes {a, b, x} against {a, b, c}: 2·2 / (3 + 3)
    assert node_f1(nodes, ["a", "b", "c"], TOOLS) == pytest.approx(2 / 3)
    # without a catalog every node counts: 2·2 / (4 + 3)
    assert node_f1(nodes, ["a", "b", "c"]) == pytest.approx(4 / 7)
    assert node_f1([], ["a", "b"], TOOLS) == 0.0


def test_edge_f1_uses_given_tool_edges_only() -> None:
    edges = [("cap:abc", "a"), ("a", "b"), ("a", "c"), ("b", "b")]
    assert dag_tool_edges(edges, ["c", "b", "a"], TOOLS) == {
        ("a", "b"),
        ("a", "c"),
    }
    # truth (a, b), (b, c); predicted (a, b), (a, c): 2·1 / (2 + 2)
    assert edge_f1(edges, [], ["a", "b", "c"], TOOLS) == pytest.approx(0.5)


def test_edge_f1_falls_back_to_order_without_tool_edges() -> None:
    edges = [("cap:abc", "a"), ("cap:abc", "b"), ("cap:abc", "c")]
    order = ["cap:abc", "a", "b", "c"]
    assert dag_tool_edges(edges, order, TOOLS) == {("a", "b"), ("b", "c")}
    assert edge_f1(edges, order, ["a", "b", "c"], TOOLS) == 1.0
    # direction matters
    assert edge_f1([], ["c", "b", "a"], ["a", "b", "c"], TOOLS) == 0.0


def test_edge_f1_empty_cases() -> None:
    assert edge_f1([], [], ["a", "b"], TOOLS) == 0.0  # nothing suggested
    assert edge_f1([], ["a"], ["a"], TOOLS) == 1.0  # one step: no edge either side
    assert edge_f1([("a", "b")], [], ["a"], TOOLS) == 0.0
    assert chain_edges(["a"]) == set()


def test_plan_metrics_means() -> None:
    metrics = PlanMetrics(tool_ids=TOOLS)
    # query 1: a → b; predictions for [] → a, [a] → b
    metrics.add_next(["a", "x"], "a", 0)  # hit@1
    metrics.add_next(["x", "c", "b"], "b", 1)  # hit@3 only
    metrics.add_dag(["a", "b"], [("a", "b")], ["a", "b"], ["a", "b"])
    # query 2: c → d → a; the planner has nothing
    for context, expected in next_step_cases(["c", "d", "a"]):
        assert len(context) < 3
        metrics.add_next([], expected, len(context))
    metrics.add_dag([], [], [], ["c", "d", "a"])
    result = metrics.result()
    assert result["predictions"] == 5
    assert result["queries"] == 2
    assert result["next_hit@1"] == pytest.approx(1 / 5)
    assert result["next_hit@3"] == pytest.approx(2 / 5)
    assert result["next_hit@1_first"] == pytest.approx(1 / 2)  # query 1 hit, query 2 missed
    assert result["next_hit@1_later"] == pytest.approx(0 / 3)
    assert result["first_predictions"] == 2
    assert result["node_f1"] == pytest.approx(0.5)
    assert result["edge_f1"] == pytest.approx(0.5)


def test_plan_metrics_without_anything() -> None:
    result = PlanMetrics().result()
    assert result == {
        "next_hit@1": 0.0,
        "next_hit@3": 0.0,
        "next_hit@1_first": 0.0,
        "next_hit@1_later": 0.0,
        "first_predictions": 0,
        "node_f1": 0.0,
        "edge_f1": 0.0,
        "queries": 0,
        "predictions": 0,
    }
