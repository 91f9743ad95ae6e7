import json

from typer.testing import CliRunner

from pml_cli.bench_search import QUERIES, stage_percentiles, synthetic_queries
from pml_cli.main import app

PHASE_KEYS = {"requests", "errors", "p50_ms", "p99_ms"}


def test_bench_search_beside_a_registration_prints_the_phases_side_by_side() -> None:
    # Nothing answers on this address: the bench starts a private system of its own.
    env = {"PML_SEARCH_ADDR": "127.0.0.1:9"}
    args = ["bench", "search", "--tools", "20", "--requests", "10", "--clients", "2"]
    result = CliRunner().invoke(app, [*args, "--neighbour-tools", "40", "--json"], env=env)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["tools"], report["neighbour_tools"], report["clients"]) == (20, 40, 2)
    assert report["alone"].keys() == PHASE_KEYS
    assert (report["alone"]["requests"], report["alone"]["errors"]) == (10, 0)
    for phase in ("during_registration", "until_consumers_caught_up"):
        assert report[phase].keys() == PHASE_KEYS
        assert report[phase]["errors"] == 0
    registration = report["registration"]
    assert (registration["status"], registration["registered"]) == ("OK", 40)
    assert registration["consumers_caught_up_s"] is not None
    phases = [
        "2 clients search while bench-",
        "searching on until the consumers of its event catch up",
        "deleting bench-",
    ]
    lines = [line for line in result.stderr.splitlines() if line.startswith(tuple(phases))]
    assert [next(p for p in phases if line.startswith(p)) for line in lines] == phases


def test_bench_search_reports_registration_first_request_and_both_sides() -> None:
    env = {"PML_SEARCH_ADDR": "127.0.0.1:9"}  # a private system, as above
    args = ["bench", "search", "--tools", "30", "--requests", "12", "--clients", "3", "--json"]
    result = CliRunner().invoke(app, [*args, "--repeats", "3"], env=env)
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert (report["tools"], report["clients"], report["requests"]) == (30, 3, 12)
    # three measurements of the one registered catalog, the top-level figures their medians
    repeats = report["repeats"]
    assert len(repeats) == 3
    assert [line for line in result.stderr.splitlines() if line.startswith("measured:")] == [
        f"measured: 12 gRPC searches from 3 clients ({r} of 3)" for r in (1, 2, 3)
    ]
    for key in ("p50_ms", "p99_ms", "qps"):
        assert report[key] == sorted(r[key] for r in repeats)[1]
    assert report["register_s"] > 0 and report["first_search_ms"] > 0
    assert report["consumers_caught_up_s"] is not None
    assert "waiting until the consumers of the registration catch up" in result.stderr
    assert 0 < report["p50_ms"] <= report["p99_ms"]
    assert 0 < report["inproc_p50_ms"] <= report["inproc_p99_ms"]
    for key in ("stages_p50_ms", "stages_p99_ms"):
        stages = report[key]
        assert {"embed", "retrieve", "graph", "rank", "server", "outside_server"} <= stages.keys()
        # The stages are read over every repeat's requests, the top-level figures are medians
        # of the repeats': the service's time is compared with the client's over the same ones.
        assert 0 < stages["server"] < stages["client"]
    assert report["stages_p50_ms"]["outside_server"] > 0


def test_stage_percentiles_split_the_client_time_at_the_service() -> None:
    stages = [{"client": 10.0, "embed": 1.0, "retrieve": 5.0}, {"client": 20.0, "embed": 3.0}]
    p99 = stage_percentiles(stages, 0.99)
    assert p99 == {
        "embed": 3.0,
        "retrieve": 5.0,
        "server": 6.0,
        "outside_server": 17.0,
        "client": 20.0,
    }
    assert stage_percentiles(stages, 0.0)["outside_server"] == 4.0


def test_bench_search_refuses_repeats_beside_a_registration() -> None:
    args = ["bench", "search", "--neighbour-tools", "10", "--repeats", "2"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code != 0
    assert "--repeats measures the searches alone" in result.output


def test_bench_search_refuses_more_neighbour_tools_than_a_request_may_hold() -> None:
    result = CliRunner().invoke(app, ["bench", "search", "--neighbour-tools", "50001"])
    assert result.exit_code == 2
    assert "--neighbour-tools" in result.output


def test_the_bench_asks_as_many_distinct_queries_as_it_says() -> None:
    queries = synthetic_queries(QUERIES)
    assert len(set(queries)) == len(queries) == QUERIES
