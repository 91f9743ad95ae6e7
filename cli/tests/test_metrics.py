import math

import pytest

from pml_cli.metrics import ToolMetrics, all_in_top, ndcg_at, recall_at, reciprocal_rank


def test_recall_counts_relevant_share_in_top_k() -> None:
    ranked = ["a", "b", "c", "d"]
    assert recall_at(ranked, ["b", "z"], 1) == 0.0
    assert recall_at(ranked, ["b", "z"], 2) == 0.5
    assert recall_at(ranked, ["a", "d"], 5) == 1.0


def test_mrr_uses_first_relevant() -> None:
    assert reciprocal_rank(["x", "y", "a"], ["a", "y"]) == pytest.approx(0.5)
    assert reciprocal_rank(["x"], ["a"]) == 0.0


def test_ndcg_binary_relevance() -> None:
    # relevant at ranks 2 and 4 of two relevant items
    dcg = 1 / math.log2(3) + 1 / math.log2(5)
    ideal = 1 / math.log2(2) + 1 / math.log2(3)
    assert ndcg_at(["x", "a", "y", "b"], ["a", "b"], 5) == pytest.approx(dcg / ideal)
    assert ndcg_at(["a", "b"], ["a", "b"], 5) == pytest.approx(1.0)


def test_all_evidence() -> None:
    assert all_in_top(["a", "b", "c"], ["a", "c"], 3) == 1.0
    assert all_in_top(["a", "b", "c"], ["a", "c"], 2) == 0.0


def test_tool_metrics_means() -> None:
    metrics = ToolMetrics()
    metrics.add(["a", "b"], ["a"])
    metrics.add(["b", "a"], ["a"])
    result = metrics.result()
    assert result["queries"] == 2
    assert result["hit@1"] == 0.5
    assert result["mrr"] == 0.75
    assert result["recall@1"] == 0.5
    assert result["recall@5"] == 1.0
