import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from pml.v1 import planner_pb2
from pml_cli import client
from pml_cli.main import app
from pml_common.local_runtime import free_port

runner = CliRunner()


class CannedPlanner:
    def __init__(self) -> None:
        self.requests: list[object] = []

    def PredictNext(
        self, request: planner_pb2.PredictNextRequest, timeout: float
    ) -> planner_pb2.PredictNextResponse:
        self.requests.append(request)
        return planner_pb2.PredictNextResponse(
            next_tool="git:git_commit",
            target_capability="co-used:commit",
            path=["git:git_add", "git:git_commit"],
            confidence=0.8,
            threshold=0.6,
            accepted=True,
            reason="shortest hyperpath",
            method=request.method,
            candidates=[
                planner_pb2.NextCandidate(tool="git:git_commit", score=0.8),
                planner_pb2.NextCandidate(tool="git:git_push", score=0.3),
            ],
        )

    def SuggestDag(
        self, request: planner_pb2.SuggestDagRequest, timeout: float
    ) -> planner_pb2.SuggestDagResponse:
        self.requests.append(request)
        return planner_pb2.SuggestDagResponse(
            target_capability="co-used:commit",
            nodes=["git:git_add", "git:git_commit"],
            edges=[
                planner_pb2.DagEdge(
                    source="git:git_add", target="git:git_commit", type="dependency"
                )
            ],
            order=["git:git_add", "git:git_commit"],
            confidence=0.4,
            threshold=0.6,
            accepted=False,
            reason="below threshold",
            method=request.method or "drdsp",
        )

    def PlannerInfo(
        self, request: planner_pb2.PlannerInfoRequest, timeout: float
    ) -> planner_pb2.PlannerInfoResponse:
        self.requests.append(request)
        return planner_pb2.PlannerInfoResponse(
            next_method="legacy",
            dag_method="drdsp",
            methods=[
                planner_pb2.MethodFigures(
                    method="drdsp",
                    predictions=40,
                    next_hit_at_1=0.25,
                    next_hit_at_3=0.5,
                    dags=12,
                    node_f1=0.625,
                ),
                planner_pb2.MethodFigures(
                    method="legacy", predictions=40, next_hit_at_1=0.5, next_hit_at_3=0.75, dags=12
                ),
            ],
            executions=12,
            skipped_executions=3,
            unjudged_executions=2,
            min_evidence=20,
            new_work_methods=[
                planner_pb2.MethodFigures(
                    method="legacy", predictions=8, next_hit_at_1=0.125, dags=4, node_f1=0.5
                )
            ],
        )


@pytest.fixture
def canned(monkeypatch: pytest.MonkeyPatch) -> CannedPlanner:
    stub = CannedPlanner()
    monkeypatch.setattr(client, "planner_stub", lambda settings: stub)
    return stub


def test_plan_next_prints_readably(canned: CannedPlanner) -> None:
    result = runner.invoke(
        app, ["plan", "next", "commit my work", "--context", "git:git_add", "--method", "legacy"]
    )
    assert result.exit_code == 0, result.output
    assert "git:git_commit" in result.stdout and "git:git_push" in result.stdout
    assert "threshold 0.600" in result.stdout and "accepted" in result.stdout
    (request,) = canned.requests
    assert list(request.context_tools) == ["git:git_add"] and request.method == "legacy"
    assert request.tenant_id == "default"


def test_plan_next_json(canned: CannedPlanner) -> None:
    result = runner.invoke(app, ["plan", "next", "commit", "--json", "--tenant", "t1"])
    assert result.exit_code == 0, result.output
    reply = json.loads(result.stdout)
    assert reply["next_tool"] == "git:git_commit"
    assert [c["tool"] for c in reply["candidates"]] == ["git:git_commit", "git:git_push"]
    # no --method: the planner chooses (the tenant's best by its figures)
    assert canned.requests[0].tenant_id == "t1" and canned.requests[0].method == ""


def test_plan_dag_prints_and_json(canned: CannedPlanner) -> None:
    result = runner.invoke(app, ["plan", "dag", "commit my work"])
    assert result.exit_code == 0, result.output
    assert "not accepted" in result.stdout and "dependency" in result.stdout
    assert "git:git_add → git:git_commit" in result.stdout
    assert any(line.split() == ["method", "drdsp"] for line in result.stdout.splitlines())
    result = runner.invoke(app, ["plan", "dag", "commit my work", "--json", "--method", "search"])
    reply = json.loads(result.stdout)
    assert reply["edges"] == [
        {"source": "git:git_add", "target": "git:git_commit", "type": "dependency"}
    ]
    assert reply["accepted"] is False and canned.requests[-1].method == "search"


def test_plan_info_prints_the_figures_and_the_choice(canned: CannedPlanner) -> None:
    result = runner.invoke(app, ["plan", "info", "--tenant", "t1"])
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert any("next step" in line and "legacy (by the figures)" in line for line in lines)
    # 12 DAGs judged: below the evidence needed, so the DAG is DR-DSP's by default.
    assert any(
        "dag" in line and "drdsp (default until every method has 20 judged)" in line
        for line in lines
    )
    assert "12 judged, 3 skipped, 2 not judged" in result.stdout
    rows = [line.replace("│", " ").split() for line in lines if line.startswith("│")]
    assert ["legacy", "40", "0.500", "0.750", "12", "0.000"] in rows
    assert "new work" in result.stdout
    assert ["legacy", "8", "0.125", "4", "0.500"] in rows  # its figures on new work alone
    (request,) = canned.requests
    assert request.tenant_id == "t1"

    result = runner.invoke(app, ["plan", "info", "--json"])
    assert result.exit_code == 0, result.output
    reply = json.loads(result.stdout)
    assert (reply["next_method"], reply["dag_method"]) == ("legacy", "drdsp")
    assert reply["methods"][0]["node_f1"] == 0.625 and reply["skipped_executions"] == "3"
    assert canned.requests[-1].tenant_id == "default"


@pytest.mark.parametrize("command", ["next", "dag"])
def test_plan_rejects_unknown_method(canned: CannedPlanner, command: str) -> None:
    result = runner.invoke(app, ["plan", command, "x", "--method", "shgat"])
    assert result.exit_code == 1
    assert "unknown method 'shgat'" in result.stderr
    assert not canned.requests


def test_plan_needs_an_intent() -> None:
    assert runner.invoke(app, ["plan", "next"]).exit_code == 2
    assert runner.invoke(app, ["plan", "dag"]).exit_code == 2


@pytest.mark.parametrize("command", ["next", "dag", "info"])
def test_plan_without_a_planner(monkeypatch: pytest.MonkeyPatch, command: str) -> None:
    monkeypatch.setenv("PML_PLANNER_ADDR", f"127.0.0.1:{free_port()}")
    args = ["plan", command] if command == "info" else ["plan", command, "commit my work"]
    result = runner.invoke(app, args)
    assert result.exit_code == 3
    assert "unavailable" in result.stderr


def test_security_settings_that_cannot_work_are_a_message(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PML_TLS_ENABLED", "true")
    monkeypatch.setenv("PML_TLS_CA_FILE", str(tmp_path / "missing-ca.pem"))
    result = runner.invoke(app, ["plan", "dag", "commit my work"])
    assert result.exit_code == 1
    assert "security settings" in result.stderr and "tls_ca_file" in result.stderr


def test_eval_plan_bad_input(tmp_path: Path) -> None:
    assert runner.invoke(app, ["eval", "plan"]).exit_code == 2  # --data is required
    result = runner.invoke(app, ["eval", "plan", "--data", str(tmp_path), "--method", "shgat"])
    assert result.exit_code == 1 and "unknown method" in result.stderr
    result = runner.invoke(app, ["eval", "plan", "--data", str(tmp_path)])
    assert result.exit_code == 1 and "cannot read" in result.stderr
    result = runner.invoke(app, ["eval", "plan", "--data", str(tmp_path), "--folds", "x"])
    assert result.exit_code == 2
    (tmp_path / "catalog.jsonl").write_text(
        json.dumps({"id": "s:a", "name": "a", "server": "s", "description": "a"}) + "\n"
    )
    (tmp_path / "queries.jsonl").write_text(
        json.dumps({"id": "L3-1", "query": "x", "relevant": ["s:a", "s:b"]}) + "\n"
    )
    result = runner.invoke(app, ["eval", "plan", "--data", str(tmp_path), "--id-prefix", "L4"])
    assert result.exit_code == 1 and "an id starting with L4" in result.stderr


def test_make_workflows(tmp_path: Path) -> None:
    result = runner.invoke(
        app, ["eval", "make-workflows", "--out", str(tmp_path / "w"), "--seed", "2"]
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "w" / "catalog.jsonl").is_file()
    assert (tmp_path / "w" / "queries.jsonl").is_file()
    assert "workflows" in result.stdout
    derived = runner.invoke(
        app, ["eval", "make-workflows", "--from", str(tmp_path / "w"), "--out", str(tmp_path / "d")]
    )
    assert derived.exit_code == 0, derived.output
    assert "sequence_from: sequence" in derived.stdout
    missing = runner.invoke(
        app,
        ["eval", "make-workflows", "--from", str(tmp_path / "nope"), "--out", str(tmp_path / "e")],
    )
    assert missing.exit_code == 1 and "cannot read" in missing.stderr
