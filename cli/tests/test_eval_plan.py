import io
import json
from pathlib import Path

import pytest
from rich.console import Console

from pml.v1 import planner_pb2
from pml_cli.eval_folds import (
    capability_id,
    capability_orders,
    co_used_capabilities,
    training_events,
)
from pml_cli.eval_plan import (
    PlanRun,
    candidates_of,
    evaluate_plan,
    methods_of,
    plan_queries,
    planner_asker,
    run_plans,
    sequence_source,
)
from pml_cli.eval_runs import PerQueryLog
from pml_cli.eval_tools import EvalError, ToolQuery
from pml_cli.workflow_sets import write_synthetic_workflows
from pml_common.settings import Settings

QUIET = Console(file=io.StringIO())


def q(qid: str, relevant: list[str], sequence: list[str] | None = None) -> ToolQuery:
    return ToolQuery(id=qid, query=f"intent {qid}", relevant=relevant, sequence=sequence)


def test_sequence_source_and_min_steps() -> None:
    ordered = [q("1", ["a", "b"], ["b", "a"]), q("2", ["c"], ["c"])]
    assert sequence_source(ordered) == "sequence"
    assert sequence_source([q("1", ["a", "b"])]) == "relevant"
    assert sequence_source([ordered[0], q("3", ["a", "b"])]) == "mixed"
    assert [x.id for x in plan_queries(ordered, 2)] == ["1"]
    assert [x.id for x in plan_queries([q("4", ["a", "a"])], 2)] == []  # repeats dropped
    levels = [q("L3-1", ["a", "b"]), q("L4-1", ["a", "b"]), q("L2-1", ["a", "b"])]
    assert [x.id for x in plan_queries(levels, 2, ("L3", "L4"))] == ["L3-1", "L4-1"]


def test_capabilities_keep_sequence_order() -> None:
    train = [
        q("1", ["a", "b", "c"], ["c", "a", "b"]),
        q("2", ["a", "b", "c"], ["c", "a", "b"]),
        q("3", ["a", "b", "c"], ["a", "b", "c"]),
        q("4", ["d"], ["d"]),
    ]
    caps = co_used_capabilities(train)
    assert caps == {("a", "b", "c"): "co-used:a+b+c"}
    long_set = tuple(f"server {i}:tool_{'x' * 40}_{i}" for i in range(12))
    long_id = capability_id(long_set)
    assert long_id.startswith("co-used:") and len(long_id) <= 512
    assert capability_id(long_set) == long_id != capability_id(long_set[:-1])
    assert capability_orders(train) == {("a", "b", "c"): ("c", "a", "b")}


def test_training_events_chain_dependencies() -> None:
    train = [q("1", ["a", "b", "c"], ["c", "a", "b"])]
    caps = co_used_capabilities(train)
    (chained,) = training_events("t", train, caps, chain=True)
    assert [s.node_id for s in chained.steps] == ["c", "a", "b"]
    assert [s.depends_on for s in chained.steps] == [[], ["c"], ["a"]]
    assert chained.capability_id == "co-used:a+b+c" and chained.tenant_id == "t"
    (plain,) = training_events("t", train, caps)
    assert all(not s.depends_on for s in plain.steps)


class FakePlanner:
    """Predicts the alphabetically next tool; suggests a fixed DAG."""

    def __init__(self) -> None:
        self.next_requests: list[planner_pb2.PredictNextRequest] = []
        self.dag_requests: list[planner_pb2.SuggestDagRequest] = []

    def PredictNext(
        self, request: planner_pb2.PredictNextRequest, timeout: float
    ) -> planner_pb2.PredictNextResponse:
        self.next_requests.append(request)
        last = request.context_tools[-1] if request.context_tools else "`"
        nxt = chr(ord(last) + 1)
        return planner_pb2.PredictNextResponse(
            next_tool=nxt,
            accepted=True,
            candidates=[
                planner_pb2.NextCandidate(tool="z", score=0.2),
                planner_pb2.NextCandidate(tool=nxt, score=0.1),
            ],
        )

    def SuggestDag(
        self, request: planner_pb2.SuggestDagRequest, timeout: float
    ) -> planner_pb2.SuggestDagResponse:
        self.dag_requests.append(request)
        return planner_pb2.SuggestDagResponse(
            nodes=["cap", "a", "b"],
            edges=[planner_pb2.DagEdge(source="cap", target="a", type="contains")],
            order=["cap", "a", "b"],
        )


def test_run_plans_asks_every_prefix_and_one_dag() -> None:
    stub = FakePlanner()
    run = PlanRun({"a", "b", "c", "z"})
    queries = [q("1", ["a", "b", "c"], ["a", "b", "c"]), q("2", ["b", "a"], ["b", "a"])]
    run_plans(planner_asker(stub, "t", "legacy"), queries, run, QUIET, "legacy", PerQueryLog(None))
    contexts = sorted(tuple(r.context_tools) for r in stub.next_requests)
    assert contexts == sorted([(), ("a",), ("a", "b"), (), ("b",)])
    assert {r.method for r in stub.next_requests} == {"legacy"}
    assert {r.tenant_id for r in stub.dag_requests} == {"t"} and len(stub.dag_requests) == 2
    result = run.result()
    assert result["next_accepted"] == 1.0 and result["dag_accepted"] == 0.0
    assert result["failed"] == 0
    # query 1: a, b, c all second → hit@3 only; query 2: [] → a (not b), [b] → c (not a)
    assert result["predictions"] == 5
    assert result["next_hit@1"] == 0.0
    assert result["next_hit@3"] == pytest.approx(3 / 5)
    # DAG tools {a, b}: query 1 F1 = 2·2/(2+3), query 2 = 1; edges by order (a, b)
    assert result["node_f1"] == pytest.approx((0.8 + 1.0) / 2)
    assert result["edge_f1"] == pytest.approx((2 * 1 / (1 + 2) + 0.0) / 2, abs=1e-4)


def test_the_default_method_names_none_so_the_planner_chooses() -> None:
    stub = FakePlanner()
    run = PlanRun({"a", "b"})
    ask = planner_asker(stub, "t", "default")
    run_plans(ask, [q("1", ["a", "b"], ["a", "b"])], run, QUIET, "default", PerQueryLog(None))
    assert {r.method for r in stub.next_requests} == {""}
    assert [r.method for r in stub.dag_requests] == [""]


def test_candidates_fall_back_to_next_tool() -> None:
    assert candidates_of(planner_pb2.PredictNextResponse(next_tool="a")) == ["a"]
    assert candidates_of(planner_pb2.PredictNextResponse()) == []


def test_methods_are_one_or_several_known_ones_in_order() -> None:
    assert methods_of("drdsp") == ["drdsp"]
    assert methods_of(" search,drdsp,search ") == ["search", "drdsp"]
    assert methods_of("knn,drdsp") == ["knn", "drdsp"]
    for bad in ("", ",", "drdsp,shgat"):
        with pytest.raises(EvalError, match="unknown method"):
            methods_of(bad)


def test_evaluate_plan_rejects_bad_input_before_starting_anything(tmp_path: Path) -> None:
    settings = Settings()
    with pytest.raises(EvalError, match="unknown method"):
        evaluate_plan(settings, tmp_path, "shgat", 5, 2, None, QUIET)
    with pytest.raises(EvalError, match="cannot read"):
        evaluate_plan(settings, tmp_path, "drdsp", 5, 2, None, QUIET)
    write_synthetic_workflows(tmp_path)
    with pytest.raises(EvalError, match="no query with 6"):
        evaluate_plan(settings, tmp_path, "drdsp", 5, 6, None, QUIET)
    with pytest.raises(EvalError, match="--folds"):
        evaluate_plan(settings, tmp_path, "drdsp", 1, 2, None, QUIET)


def test_plan_knn_needs_no_service_and_the_split_shows_memory(tmp_path: Path) -> None:
    """`knn` alone on the synthetic workflows (26 workflows, several phrasings each): under the
    query split the nearest past intent often ran the same workflow; under the workflow split
    it never did, and the figures say so."""
    write_synthetic_workflows(tmp_path)
    nowhere = Settings(planner_addr="127.0.0.1:9", search_addr="127.0.0.1:9")
    results = {}
    for split in ("query", "workflow"):
        log = tmp_path / f"{split}.jsonl"
        results[split] = evaluate_plan(nowhere, tmp_path, "knn", 5, 2, None, QUIET, split, 0, log)
        lines = [json.loads(line) for line in log.read_text().splitlines()]
        assert len(lines) == results[split]["queries"]
        first = lines[0]
        assert first["method"] == "knn" and first["error"] is None
        assert len(first["next"]) == len(first["relevant"])  # one prediction per step
        assert set(first["metrics"]) == {"next_hit@1", "next_hit@3", "node_f1", "edge_f1"}
    memory, unseen = results["query"], results["workflow"]
    assert unseen["test_gold_seen"] == 0 and memory["test_gold_seen"] > 0
    assert unseen["split"] == "workflow" and unseen["models"] == []
    assert unseen["trainer_seed"] is None  # no system started, none seeded
    knn_memory, knn_unseen = memory["methods"]["knn"], unseen["methods"]["knn"]
    assert knn_memory["node_f1"] > knn_unseen["node_f1"]
    assert knn_memory["failed"] == 0 and knn_memory["dag_accepted"] == 1.0
    assert "vs_best_baseline" not in knn_memory  # a baseline is not compared with itself
