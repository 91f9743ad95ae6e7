"""The planner end to end: capabilities learned from events become the suggested DAG, runs that
fail along one branch move the suggestion to the other, and every run is judged by each planning
method before it is learned from (PlannerInfo, `pml plan info`). Public interfaces only."""

from __future__ import annotations

import asyncio
import json
import subprocess
from collections.abc import Callable, Iterator

import grpc
import pytest

from pml.v1 import planner_pb2, planner_pb2_grpc
from pml_cli.client import publish_events
from pml_cli.local_stack import LocalStack
from pml_common.events import (
    CapabilityLearned,
    CapabilitySpec,
    ExecutionCompleted,
    ExecutionStep,
    ToolSpec,
    ToolsRegistered,
)

pytestmark = pytest.mark.e2e

TOOLS = {
    "report:build_weekly": "Build the weekly activity report as a PDF.",
    "mail:send": "Send an email with attachments to a list of recipients.",
    "chat:post": "Post a message with a file to a team chat channel.",
    "calendar:list": "List calendar events.",
}
BRANCHES = {
    "report-by-mail": (
        "Share the weekly report with the team by email",
        ["report:build_weekly", "mail:send"],
    ),
    "report-by-chat": (
        "Share the weekly report with the team in the chat channel",
        ["report:build_weekly", "chat:post"],
    ),
}
INTENT = "share the weekly report with the team"


@pytest.fixture(scope="module")
def planner(stack: LocalStack) -> Iterator[planner_pb2_grpc.PlannerServiceStub]:
    stack.start_services(["scorer", "planner"])
    with grpc.insecure_channel(stack.settings.planner_addr) as channel:
        yield planner_pb2_grpc.PlannerServiceStub(channel)


def _dag(
    planner: planner_pb2_grpc.PlannerServiceStub, tenant: str
) -> planner_pb2.SuggestDagResponse:
    return planner.SuggestDag(
        planner_pb2.SuggestDagRequest(tenant_id=tenant, intent=INTENT), timeout=30
    )


def test_learned_capabilities_become_the_dag_failures_move_it_and_runs_are_judged(
    stack: LocalStack,
    planner: planner_pb2_grpc.PlannerServiceStub,
    e2e_tenant: str,
    eventually: Callable[..., object],
    pml: Callable[..., subprocess.CompletedProcess[str]],
) -> None:
    tools = [
        ToolSpec(id=t, server=t.split(":")[0], name=t.split(":")[1], description=d)
        for t, d in TOOLS.items()
    ]
    learned = [
        CapabilityLearned.create(
            tenant_id=e2e_tenant,
            capability=CapabilitySpec(id=cid, name=cid, description=text, tools=members),
        )
        for cid, (text, members) in BRANCHES.items()
    ]
    asyncio.run(
        publish_events(
            stack.settings, [ToolsRegistered.create(tenant_id=e2e_tenant, tools=tools), *learned]
        )
    )

    first = eventually(
        lambda: _dag(planner, e2e_tenant), lambda r: r.target_capability in BRANCHES, timeout=90
    )
    chosen = first.target_capability  # type: ignore[attr-defined]
    members = BRANCHES[chosen][1]
    assert set(first.nodes) == {chosen, *members}  # type: ignore[attr-defined]
    assert list(first.order)[-1] == chosen  # type: ignore[attr-defined]
    assert list(first.order).index(members[0]) < list(first.order).index(members[1])  # type: ignore[attr-defined]
    assert {(e.source, e.target) for e in first.edges} >= {(m, chosen) for m in members}  # type: ignore[attr-defined]

    # Strategic discovery, from what already ran: the mail step points at the mail branch.
    found = planner.PredictNext(
        planner_pb2.PredictNextRequest(
            tenant_id=e2e_tenant, intent=INTENT, context_tools=["mail:send"], method="discovery"
        ),
        timeout=30,
    )
    assert found.target_capability == "report-by-mail"
    assert [c.tool for c in found.candidates] == ["report:build_weekly"]

    # Runs of the chosen branch fail at its last step.
    failures = [
        ExecutionCompleted.create(
            tenant_id=e2e_tenant,
            intent=INTENT,
            steps=[
                ExecutionStep(node_id=members[0], success=True),
                ExecutionStep(node_id=members[1], success=False, error="recipient rejected"),
            ],
            outcome="failure",
            capability_id=chosen,
        )
        for _ in range(8)
    ]
    asyncio.run(publish_events(stack.settings, failures))
    other = next(c for c in BRANCHES if c != chosen)
    moved = eventually(
        lambda: _dag(planner, e2e_tenant), lambda r: r.target_capability == other, timeout=120
    )
    assert set(moved.nodes) == {other, *BRANCHES[other][1]}  # type: ignore[attr-defined]

    # Each run was judged by every method (its two tools are known to the tenant's planner):
    # two next-step predictions and one DAG each, too few yet to choose a method but DR-DSP.
    info = eventually(
        lambda: planner.PlannerInfo(
            planner_pb2.PlannerInfoRequest(tenant_id=e2e_tenant), timeout=30
        ),
        lambda r: r.executions + r.skipped_executions >= len(failures),
        timeout=60,
    )
    assert (info.executions, info.skipped_executions) == (len(failures), 0)  # type: ignore[attr-defined]
    assert info.next_method == info.dag_method == "drdsp"  # type: ignore[attr-defined]
    figures = {m.method: m for m in info.methods}  # type: ignore[attr-defined]
    assert set(figures) == {"drdsp", "legacy", "discovery", "search", "blend"}
    for m in figures.values():
        assert (m.predictions, m.dags) == (2 * len(failures), len(failures))
    # The first run of that set of tools was new work; the seven after it repeated it.
    on_new_work = {m.method: m for m in info.new_work_methods}  # type: ignore[attr-defined]
    assert set(on_new_work) == set(figures)
    assert all((m.predictions, m.dags) == (2, 1) for m in on_new_work.values())
    # Search ranks the tenant's 4 tools: once the report is built, the 3 left are its first 3.
    assert figures["search"].next_hit_at_3 > 0
    shown = pml("plan", "info", "--tenant", e2e_tenant, "--json")
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["executions"] == str(len(failures))


def test_bad_input_is_refused(planner: planner_pb2_grpc.PlannerServiceStub) -> None:
    with pytest.raises(grpc.RpcError) as info:
        planner.PlannerInfo(planner_pb2.PlannerInfoRequest(tenant_id="bad\x00tenant"), timeout=10)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    for request in (
        planner_pb2.SuggestDagRequest(intent="  "),
        planner_pb2.SuggestDagRequest(intent="x", method="telepathy"),
    ):
        with pytest.raises(grpc.RpcError) as info:
            planner.SuggestDag(request, timeout=10)
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert info.value.details()
    with pytest.raises(grpc.RpcError) as info:
        planner.PredictNext(
            planner_pb2.PredictNextRequest(intent="x", context_tools=["a"] * 101), timeout=10
        )
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    # Context tools follow SearchTools' rule: tool ids, without control characters.
    for bad in ("not a tool id", "mail:send\x00", "mail :send"):
        with pytest.raises(grpc.RpcError) as info:
            planner.PredictNext(
                planner_pb2.PredictNextRequest(intent="x", context_tools=["mail:send", bad]),
                timeout=10,
            )
        assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "context_tools must be tool ids" in info.value.details()
