import io
import json

from rich.console import Console

from pml_cli.bench_planner import bench_planner

KEYS = {
    "p50_ms",
    "p99_ms",
    "forward_p50_ms",
    "forward_p99_ms",
    "backward_p50_ms",
    "backward_p99_ms",
    "dag_p50_ms",
    "dag_p99_ms",
    "cold_tree_ms",
    "update_p50_ms",
    "update_p99_ms",
    "update_mean_ms",
    "recompute_p50_ms",
    "update_speedup",
    "update_speedup_mean",
}


def test_bench_planner_reports_numbers_only() -> None:
    result = bench_planner(300, 50, Console(file=io.StringIO()), kept=2, recompute_rounds=2)
    assert result.keys() >= KEYS
    assert result["hyperedges"] == 300 and result["kept_trees"] == 4
    assert all(isinstance(v, int | float) and v >= 0 for v in result.values())
    json.dumps(result)
