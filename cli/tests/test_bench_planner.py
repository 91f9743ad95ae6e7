import io
import json

from rich.console import Console
from typer.testing import CliRunner

from pml_cli.bench_planner import bench_planner
from pml_cli.main import app

KEYS = {
    "forward_p50_ms",
    "forward_p99_ms",
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
    assert result["hyperedges"] == 300 and result["kept_trees"] == 2
    assert all(isinstance(v, int | float) and v >= 0 for v in result.values())
    json.dumps(result)


def test_bench_planner_shows_every_phase_on_stderr_and_prints_json_alone_on_stdout() -> None:
    result = CliRunner().invoke(
        app, ["bench", "planner", "--hyperedges", "300", "--queries", "50", "--json"]
    )
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report.keys() >= KEYS
    # stderr is not a terminal here: the lines that open the phases are what it shows of them
    phases = [
        "building a hypergraph of 300 hyperedges",
        "warm-up: building the 8 kept trees",
        "measured: 50 forward and DAG queries each",
        "measured: 50 incremental updates",
        "measured: 5 full recomputes of 8 trees",
    ]
    assert [line for line in result.stderr.splitlines() if line in phases] == phases
