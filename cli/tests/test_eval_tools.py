"""`pml eval tools` pieces: the folds by query and by workflow, the supervised baselines, the
per-group figures, the per-query log, failures that do not end a run, and the comparison with
the best baseline. Runs that need the system are in test_eval_tools_system.py."""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console
from typer.testing import CliRunner

from pml_cli import eval_folds
from pml_cli.eval_baselines import PlanKnn, ToolKnn, by_popularity, next_candidates, popularity
from pml_cli.eval_data import EvalError, QuerySelection, ToolQuery
from pml_cli.eval_runs import (
    Grouped,
    compare_to_baselines,
    fit_queries,
    fit_query,
    group_of,
    methods_of,
    per_query_log,
)
from pml_cli.eval_split import gold_seen, gold_sets, train_test_folds, workflow_groups
from pml_cli.eval_tools import ToolRun, rank_queries
from pml_cli.main import app
from pml_cli.metrics import ToolMetrics
from pml_common.local_runtime import free_port
from pml_common.settings import Settings

QUIET = Console(file=io.StringIO())
TOOLS = "abcdefgh"


def q(qid: str, relevant: list[str], sequence: list[str] | None = None) -> ToolQuery:
    return ToolQuery(id=qid, query=f"intent {qid}", relevant=relevant, sequence=sequence)


# --- folds ---------------------------------------------------------------------------------

tool_sets = st.lists(st.sampled_from(TOOLS), min_size=1, max_size=3, unique=True)
query_lists = st.lists(
    st.tuples(tool_sets, st.booleans(), st.booleans()), min_size=6, max_size=40
).map(
    lambda rows: [
        q(f"q-{i}", tools, (tools[::-1][:2] if reverse else tools) if has_sequence else None)
        for i, (tools, has_sequence, reverse) in enumerate(rows)
    ]
)


@settings(max_examples=150, deadline=None)
@given(queries=query_lists, folds=st.integers(2, 4), seed=st.integers(0, 3))
def test_workflow_split_never_shows_a_test_gold_set_in_training(
    queries: list[ToolQuery], folds: int, seed: int
) -> None:
    if folds > len(workflow_groups(queries)):
        with pytest.raises(EvalError, match="distinct gold tool sets"):
            train_test_folds(queries, folds, "workflow", seed)
        return
    parts = train_test_folds(queries, folds, "workflow", seed)
    tested = [x.id for _, test in parts for x in test]
    assert sorted(tested) == sorted(x.id for x in queries)  # every query tested exactly once
    for train, test in parts:
        assert test, "no fold is empty"
        trained = {gold for x in train for gold in gold_sets(x)}
        assert not any(gold_sets(x) & trained for x in test)
        assert gold_seen(train, test) == 0
        assert {x.id for x in train}.isdisjoint(x.id for x in test)
    assert parts == train_test_folds(queries, folds, "workflow", seed)  # deterministic


def test_query_split_lets_a_test_gold_set_be_seen_and_says_so() -> None:
    queries = [q(f"q-{i}", ["a", "b"]) for i in range(6)] + [q("q-6", ["c"])]
    train, test = train_test_folds(queries, 2, "query")[0]
    assert gold_seen(train, test) >= 1
    train, test = train_test_folds(queries, 2, "workflow")[0]
    assert gold_seen(train, test) == 0


def test_workflow_groups_join_relevant_and_sequence_sets() -> None:
    # q-1 shares its relevant set with q-0 and its steps with q-2: one group of three.
    queries = [
        q("q-0", ["a", "b", "c"]),
        q("q-1", ["a", "b", "c"], ["a", "d"]),
        q("q-2", ["d", "a"]),
        q("q-3", ["e"]),
    ]
    assert sorted(map(sorted, workflow_groups(queries))) == [[0, 1, 2], [3]]


def test_unknown_split_is_refused() -> None:
    with pytest.raises(EvalError, match="unknown split 'tools'"):
        train_test_folds([q("q-0", ["a"]), q("q-1", ["b"])], 2, "tools")


# --- baselines -----------------------------------------------------------------------------


def test_popular_ranks_by_training_use_then_id() -> None:
    train = [q("1", ["b", "a"]), q("2", ["c", "b"]), q("3", ["x"], ["c", "d"])]
    counts = popularity(train)  # the steps run: sequence when given
    assert counts == {"a": 1, "b": 2, "c": 2, "d": 1}
    assert by_popularity(counts) == ["b", "c", "a", "d"]


def test_knn_sums_neighbour_similarities_then_popularity() -> None:
    train = [q("1", ["a", "b"]), q("2", ["b", "c"]), q("3", ["d"]), q("4", ["e", "d"])]
    vectors = np.array([[1.0, 0.0], [0.8, 0.6], [0.0, 1.0], [-1.0, 0.0]], dtype=np.float32)
    query = np.array([1.0, 0.0], dtype=np.float32)
    # k = 2: neighbours 1 (sim 1.0) and 2 (0.8): b 1.8, a 1.0, c 0.8; the rest by
    # popularity (d twice, then e); no tool from outside the catalog of training steps.
    assert ToolKnn(train, vectors, k=2).rank(query, 10) == ["b", "a", "c", "d", "e"]
    assert ToolKnn(train, vectors, k=2).rank(query, 2) == ["b", "a"]
    # k = 4: 3 adds d at similarity 0 and 4 adds e, d at -1 counted as 0: d, e score 0 and
    # follow c, d first as the more popular.
    assert ToolKnn(train, vectors, k=4).rank(query, 10) == ["b", "a", "c", "d", "e"]
    tie = [q("1", ["a"]), q("2", ["b"]), q("3", ["b"])]
    same = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0]], dtype=np.float32)
    assert ToolKnn(tie, same, k=2).rank(query, 10) == ["b", "a"]  # a = b = 1.0: b is more popular


def test_plan_knn_follows_the_nearest_sequence() -> None:
    train = [q("1", ["x"], ["a", "b", "c"]), q("2", ["x"], ["d", "e"])]
    knn = PlanKnn(train, np.array([[1.0, 0.0], [0.0, 1.0]], dtype=np.float32))
    assert knn.nearest(np.array([0.9, 0.1], dtype=np.float32)) == ["a", "b", "c"]
    sequence = ["a", "b", "c"]
    assert next_candidates(sequence, []) == ["a", "b", "c"]
    assert next_candidates(sequence, ["a"]) == ["b", "c"]
    assert next_candidates(sequence, ["x", "b"]) == ["c", "a"]
    assert next_candidates(sequence, ["a", "b", "c"]) == ["a"]  # after the last: its first
    assert next_candidates(sequence, ["z"]) == ["a", "b", "c"]  # unknown tool: its first
    assert next_candidates([], ["a"]) == []


# --- runs ----------------------------------------------------------------------------------


def test_group_of_takes_the_prefix_before_the_last_dash() -> None:
    assert group_of("etom-L1-0001") == "etom-L1"
    assert group_of("multi-3") == "multi"
    assert group_of("q7") is None
    assert group_of("-7") is None


def test_grouped_figures_keep_the_overall_ones() -> None:
    grouped = Grouped(ToolMetrics)
    for qid, ranked in (("L1-1", ["a"]), ("L1-2", ["b"]), ("L2-1", ["a"]), ("plain", ["a"])):
        for metrics in grouped.of(qid):
            metrics.add(ranked, ["a"])
    result = grouped.result()
    assert result["queries"] == 4 and result["hit@1"] == 0.75
    assert result["by_group"]["L1"]["hit@1"] == 0.5 and result["by_group"]["L1"]["queries"] == 2
    assert result["by_group"]["L2"]["hit@1"] == 1.0
    assert set(result["by_group"]) == {"L1", "L2"}
    assert "by_group" not in Grouped(ToolMetrics).result()


def test_long_queries_are_cut_to_the_limit_and_counted() -> None:
    assert fit_query("abcdef", 4) == "abcd" and fit_query("abc", 4) == "abc"
    queries = [q("1", ["a"]), ToolQuery(id="2", query="x" * 12, relevant=["a"])]
    fitted, cut = fit_queries(queries, 10)  # "intent 1" has 8 characters
    assert cut == 1 and [x.query for x in fitted] == ["intent 1", "x" * 10]


class Refused(grpc.RpcError):
    """What a stub raises when the service answers with an error status."""

    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.INVALID_ARGUMENT

    def details(self) -> str:
        return "query must not be empty"


def test_a_failing_query_is_reported_scored_as_a_miss_and_logged(tmp_path: Path) -> None:
    queries = [q("L1-1", ["a"]), q("L1-2", ["b"]), q("L2-1", ["a", "b"])]

    def rank(query: ToolQuery) -> list[str]:
        if query.id == "L1-2":
            raise Refused()
        return ["a", "b", "c"]

    path = tmp_path / "per-query.jsonl"
    with per_query_log(path) as log:
        run = rank_queries(rank, queries, ToolRun(), QUIET, "unified", log, fold=2)
    result = run.result()
    assert result["queries"] == 3 and result["failed"] == 1
    assert result["errors"] == ["L1-2: INVALID_ARGUMENT: query must not be empty"]
    assert result["hit@1"] == pytest.approx(2 / 3, abs=1e-4)  # the failed query counts as a miss
    assert result["by_group"]["L1"]["hit@1"] == 0.5
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    assert [line["id"] for line in lines] == ["L1-1", "L1-2", "L2-1"]
    failed = lines[1]
    assert failed["error"].startswith("INVALID_ARGUMENT") and failed["ranked"] == []
    assert failed["metrics"]["recall@5"] == 0.0 and failed["fold"] == 2
    assert lines[2]["metrics"]["recall@5"] == 1.0 and lines[2]["method"] == "unified"
    assert lines[0]["query"] == "intent L1-1" and lines[0]["relevant"] == ["a"]


def test_per_query_file_that_cannot_be_written_is_an_eval_error(tmp_path: Path) -> None:
    with pytest.raises(EvalError, match="cannot write"), per_query_log(tmp_path / "no" / "f"):
        pass


def test_every_method_is_compared_with_the_best_baseline() -> None:
    results: dict[str, dict[str, Any]] = {
        "knn": {"recall@5": 0.8, "mrr": 0.5},
        "popular": {"recall@5": 0.3, "mrr": 0.6},
        "shgat": {"recall@5": 0.7, "mrr": 0.7},
    }
    compare_to_baselines(results, ("knn", "popular"), ("recall@5", "mrr"))
    assert results["shgat"]["vs_best_baseline"] == {"recall@5": -0.1, "mrr": 0.1}
    assert results["shgat"]["best_baseline"] == {"recall@5": "knn", "mrr": "popular"}
    assert "vs_best_baseline" not in results["knn"]
    alone: dict[str, dict[str, Any]] = {"cosine": {"recall@5": 0.5}}
    compare_to_baselines(alone, ("knn",), ("recall@5",))
    assert "vs_best_baseline" not in alone["cosine"]


def test_methods_are_known_ones_in_order() -> None:
    assert methods_of(" knn,shgat,knn ", ("shgat", "knn")) == ["knn", "shgat"]
    with pytest.raises(EvalError, match="unknown method 'knn' with nothing"):
        methods_of("knn", ("cosine",), "with nothing")


# --- command line --------------------------------------------------------------------------

runner = CliRunner()


def test_eval_tools_bad_input_is_a_message(tmp_path: Path) -> None:
    args = ["eval", "tools", "--data", str(tmp_path)]
    result = runner.invoke(app, [*args, "--split", "workflow"])
    assert result.exit_code == 1 and "--split need --folds" in result.stderr
    result = runner.invoke(app, [*args, "--method", "knn"])
    assert result.exit_code == 1 and "unknown method 'knn' without --folds" in result.stderr
    result = runner.invoke(app, [*args, "--method", "shgat,bm25", "--folds", "5"])
    assert result.exit_code == 1 and "unknown method" in result.stderr
    result = runner.invoke(app, [*args, "--method", "knn", "--folds", "5"])
    assert result.exit_code == 1 and "cannot read" in result.stderr


def test_query_selection_keeps_id_prefixes_then_min_relevant_then_the_first_n() -> None:
    queries = [
        q("etom-L1-1", ["a"]),
        q("etom-L3-1", ["a", "b"]),
        q("etom-L2-1", ["a", "b"]),
        q("etom-L4-1", ["a", "c"]),
        q("etom-L3-2", ["a"]),
    ]
    multi_step = QuerySelection(id_prefixes=("etom-L3", "etom-L4"), min_relevant=2)
    assert [x.id for x in multi_step.apply(queries)] == ["etom-L3-1", "etom-L4-1"]
    first = multi_step.model_copy(update={"max_queries": 1})
    assert [x.id for x in first.apply(queries)] == ["etom-L3-1"]
    assert QuerySelection().apply(queries) == queries


def test_a_selection_that_keeps_nothing_says_what_was_asked(tmp_path: Path) -> None:
    tool = {"id": "fs:read", "server": "fs", "name": "read", "description": "Read a file."}
    (tmp_path / "catalog.jsonl").write_text(json.dumps(tool) + "\n")
    (tmp_path / "queries.jsonl").write_text(
        json.dumps({"id": "etom-L1-1", "query": "read it", "relevant": ["fs:read"]}) + "\n"
    )
    args = ["eval", "tools", "--data", str(tmp_path), "--method", "knn", "--folds", "2"]
    result = runner.invoke(app, [*args, "--id-prefix", "etom-L3, etom-L4"])
    assert result.exit_code == 1
    assert "no query with 1+ relevant tools and an id starting with etom-L3 or etom-L4" in (
        " ".join(result.stderr.split())
    )
    result = runner.invoke(app, [*args, "--max-queries", "0"])
    assert result.exit_code == 2 and "--max-queries" in result.stderr


def test_a_fold_whose_model_never_comes_is_reported_not_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(eval_folds, "TRAINING_TIMEOUT_S", 0.5)
    nowhere = Settings(scorer_addr=f"127.0.0.1:{free_port()}")  # every ModelInfo fails
    served = eval_folds.wait_for_model(nowhere, "t", 10)
    assert (served.complete, served.admitted, served.version) == (False, False, "")
    assert "all 10 executions" in served.note


def test_an_evaluation_seeds_the_trainer_it_starts_unless_a_seed_is_set() -> None:
    assert eval_folds.seeded_trainer(Settings()) == {"train_seed": eval_folds.TRAINER_SEED}
    assert eval_folds.seeded_trainer(Settings(train_seed=5)) == {}  # the caller's seed is kept
