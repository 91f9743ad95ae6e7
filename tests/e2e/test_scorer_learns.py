"""Executions published on the stream lead to a new SHGAT version served by the scorer, and the
executed capability's score for that intent rises. Public interfaces only: gRPC and streams."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator

import grpc
import pytest

from pml.v1 import common_pb2, scorer_pb2, scorer_pb2_grpc, search_pb2, search_pb2_grpc
from pml_cli.client import publish_events
from pml_cli.local_stack import LocalStack
from pml_common.events import ExecutionCompleted, ExecutionStep

pytestmark = pytest.mark.e2e

TOOLS = {
    "fs:read_file": "Read the complete contents of a file.",
    "fs:write_file": "Create or overwrite a file.",
    "s3:upload": "Upload an object to a storage bucket.",
    "s3:list": "List the objects of a bucket.",
    "mail:send": "Send an email message.",
    "cal:create_event": "Create a calendar event.",
    "web:search": "Search the web.",
    "web:fetch": "Fetch a web page.",
}
CAPABILITIES = {
    "backup": ["fs:read_file", "s3:upload"],
    "research": ["web:search", "web:fetch"],
    "invite": ["cal:create_event", "mail:send"],
}
INTENTS = {
    "backup": [
        "keep my notes safe somewhere else",
        "make sure my diary survives a disk crash",
        "put a copy of the thesis out of harm's way",
        "save my photos away from this laptop",
    ],
    "research": [
        "find out what people say about rust",
        "gather material on solar panels",
        "learn about the history of tea",
    ],
    "invite": [
        "get the team together on friday",
        "organise a meeting with alice",
        "set up a catch-up with the designers",
    ],
}
PROBE = "keep my notes safe somewhere else"


@pytest.fixture(scope="module")
def scorer(stack: LocalStack) -> Iterator[scorer_pb2_grpc.ScorerServiceStub]:
    stack.start_services(["scorer"])
    with grpc.insecure_channel(stack.settings.scorer_addr) as channel:
        yield scorer_pb2_grpc.ScorerServiceStub(channel)


def _backup_score(scorer: scorer_pb2_grpc.ScorerServiceStub, tenant: str) -> tuple[float, str]:
    reply = scorer.ScoreCapabilities(
        scorer_pb2.ScoreRequest(tenant_id=tenant, text=PROBE, top_k=10), timeout=30
    )
    scores = {s.id: s.score for s in reply.scores}
    return scores.get("backup", -1.0), reply.model_version


def test_executions_lead_to_a_served_model_that_prefers_the_executed_capability(
    stack: LocalStack,
    scorer: scorer_pb2_grpc.ScorerServiceStub,
    search_stub: search_pb2_grpc.SearchServiceStub,
    e2e_tenant: str,
    eventually: Callable[..., object],
) -> None:
    search_stub.RegisterTools(
        search_pb2.RegisterToolsRequest(
            tenant_id=e2e_tenant,
            tools=[
                common_pb2.Tool(id=t, server=t.split(":")[0], name=t.split(":")[1], description=d)
                for t, d in TOOLS.items()
            ],
        ),
        timeout=60,
    )
    search_stub.RegisterCapabilities(
        search_pb2.RegisterCapabilitiesRequest(
            tenant_id=e2e_tenant,
            capabilities=[
                common_pb2.Capability(id=c, name=c, tools=tools)
                for c, tools in CAPABILITIES.items()
            ],
        ),
        timeout=60,
    )
    # The trainer writes the graph, GraphChanged reaches the scorer: three capabilities served.
    eventually(lambda: _backup_score(scorer, e2e_tenant), lambda r: r[0] >= 0, timeout=60)
    before, version = _backup_score(scorer, e2e_tenant)
    assert version == "untrained"

    events = [
        ExecutionCompleted.create(
            tenant_id=e2e_tenant,
            intent=intent,
            steps=[ExecutionStep(node_id=t, success=True) for t in CAPABILITIES[cap]],
            outcome="success",
            capability_id=cap,
        )
        for _ in range(2)
        for cap, intents in INTENTS.items()
        for intent in intents
    ]
    assert len(events) >= stack.settings.replay_min_traces
    asyncio.run(publish_events(stack.settings, events))

    info = eventually(
        lambda: scorer.ModelInfo(scorer_pb2.ModelInfoRequest(tenant_id=e2e_tenant), timeout=30),
        lambda i: i.version != "untrained" and i.metrics.get("traces_seen", 0) >= len(events),
        timeout=240,
    )
    assert info.fencing_token > 0 and info.num_capabilities == 3  # type: ignore[attr-defined]
    after, served = _backup_score(scorer, e2e_tenant)
    assert served != "untrained"
    assert after > before + 0.05, (before, after)
