import json

import pytest
from typer.testing import CliRunner

from pml_cli.main import app

KEYS = {
    "events",
    "entries",
    "duplicate_entries",
    "events_per_s",
    "raw_events_per_s",
    "ratio",
    "bus_s",
    "raw_s",
    "bus_cpu_s",
    "raw_cpu_s",
    "cpu_ratio",
    "handled",
    "handled_more_than_once",
    "not_handled",
}


def test_bench_bus_handles_every_event_exactly_once_and_prints_json() -> None:
    result = CliRunner().invoke(app, ["bench", "bus", "--events", "300", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report.keys() == KEYS
    # 300 events, three of them published twice with the same id: the bus runs each handler once
    assert (report["events"], report["entries"], report["duplicate_entries"]) == (300, 303, 3)
    assert report["handled"] == 300
    assert report["handled_more_than_once"] == 0 and report["not_handled"] == 0
    assert report["events_per_s"] > 0 and report["raw_events_per_s"] > 0
    ratio = report["events_per_s"] / report["raw_events_per_s"]
    assert abs(report["ratio"] - ratio) < 0.01
    assert report["bus_cpu_s"] > 0 and report["raw_cpu_s"] > 0
    # both CPU times are rounded to 10 ms, which a short run feels
    cpu_quotient = report["raw_cpu_s"] / report["bus_cpu_s"]
    assert report["cpu_ratio"] == pytest.approx(cpu_quotient, rel=0.2)
    # every phase opened on stderr, which is not a terminal here, in order
    phases = [
        "preparing 300 execution events",
        "starting a private Redis",
        "raw redis-py: publishing and consuming 303 entries",
        "pml bus (FastStream): publishing and consuming 303 entries",
        "stopping Redis",
    ]
    assert [line for line in result.stderr.splitlines() if line in phases] == phases


def test_bench_bus_refuses_a_count_below_one() -> None:
    result = CliRunner().invoke(app, ["bench", "bus", "--events", "0"])
    assert result.exit_code == 2
    assert "--events" in result.output
