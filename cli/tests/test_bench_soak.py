"""`pml bench soak` on a short run: its own system, the three faults, nothing lost or doubled."""

import json

import pytest
from typer.testing import CliRunner

from pml_cli.main import app

KEYS = {
    "minutes",
    "load_s",
    "clients",
    "requests",
    "requests_per_s",
    "search_ms",
    "events_per_s",
    "errors",
    "faults",
    "drain_s",
    "drained",
    "events",
    "lost",
    "double_effects",
    "passed",
}
EVENT_KEYS = {
    "executions_published",
    "duplicate_entries",
    "executions_applied",
    "registrations_ok",
    "documents_accepted",
    "documents_done",
    "redelivered_already_applied",
    "dead_letters",
}
FAULTS = ["consumer_sigkilled", "redis_restarted", "neo4j_stopped"]
#: Phases every run opens, in this order (the load's own bars are left out: how many show
#: depends on how long the faults take).
PHASES = [
    "set-up: starting Redis, Neo4j, search, two trainers, ingest and its pass workers",
    "set-up: registering 200 catalog tools",
    "fault: SIGKILL to the trainer consumer holding the most entries",
    "fault: Redis shut down (its data saved) and restarted",
    "fault: Neo4j stopped",
    "load: stopping the clients",
    "drain: executions applied / published",
    "checks: stopping the trainers, so nothing changes under them",
    "checks: executions applied once, registrations and documents through",
    "teardown: stopping the private system",
]


# Start-up, the faults' recoveries (a reclaim waits 30 s) and the drain take minutes.
@pytest.mark.timeout(1800)
def test_a_short_soak_through_three_faults_loses_nothing_and_counts_nothing_twice() -> None:
    # Low rates: the machine running the suite is shared and the trainer must keep up.
    args = ["--minutes", "0.5", "--search-rate", "10", "--event-rate", "2", "--json"]
    result = CliRunner().invoke(app, ["bench", "soak", *args])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report.keys() == KEYS
    assert [f["fault"] for f in report["faults"]] == FAULTS
    assert all(f["recovered_after_s"] is not None for f in report["faults"]), report["faults"]
    # Redis came back with its data, so the consumer groups and the queued entries survived.
    assert report["faults"][1]["keys_after_restart"] > 0
    assert report["drained"] is True
    assert report["lost"] == {"executions": 0, "registrations": 0, "documents": 0, "total": 0}
    assert report["double_effects"] == 0
    assert report["passed"] is True
    events = report["events"]
    assert events.keys() == EVENT_KEYS
    assert events["executions_applied"] == events["executions_published"] > 0
    assert events["duplicate_entries"] > 0  # the producer published some events twice
    assert events["registrations_ok"] > 0
    assert events["documents_done"] == events["documents_accepted"] > 0
    assert events["dead_letters"] == {}
    for window in ("outside_faults", "during_faults"):
        assert report["search_ms"][window]["count"] > 0
    assert [line for line in result.stderr.splitlines() if line in PHASES] == PHASES


def test_bench_soak_refuses_a_length_below_its_minimum() -> None:
    result = CliRunner().invoke(app, ["bench", "soak", "--minutes", "0"])
    assert result.exit_code == 2
    assert "--minutes" in result.output
