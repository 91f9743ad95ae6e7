"""The system under attack as the tests reach it: a channel per service, health, and the victim
tenant whose data no attack may change."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import grpc
from google.protobuf.message import Message

from pml.v1 import common_pb2, ingest_pb2, knowledge_pb2, scorer_pb2, search_pb2
from pml_common.bus import EVENT_FIELD
from pml_common.events import ExecutionCompleted, ExecutionStep
from pml_common.healthcheck import check
from pml_common.settings import Settings
from pml_common.testing import until

from . import wire
from .hostile import VICTIM, VICTIM_CAPABILITY, VICTIM_DOCUMENT, VICTIM_MARK, VICTIM_TOOLS
from .report import Terse
from .streams import BusWatch

_SEARCH = "/pml.v1.SearchService/"
_SCORER = "/pml.v1.ScorerService/"
_INGEST = "/pml.v1.IngestService/"
_ASK = "/pml.v1.KnowledgeService/Ask"
_VICTIM_QUERY = "open the vault and read the secret"


@dataclass(frozen=True)
class Services(Terse):
    settings: Settings
    channels: dict[str, grpc.Channel]  # service name -> channel to the server serving it
    health_addresses: Sequence[str]  # every service process, the trainer included

    def call(self, path: str, request: Message | bytes) -> wire.Answer:
        return wire.call(self.channels[wire.service_of(path)], path, request)

    def node(self, tenant: str, node_id: str) -> wire.Answer:
        return self.call(
            _SEARCH + "GetNode", search_pb2.GetNodeRequest(tenant_id=tenant, id=node_id)
        )

    def assert_answering(self) -> None:
        """Every service is SERVING and search answers the victim's query."""
        down = [
            a for a in self.health_addresses if not check(a, timeout=10, settings=self.settings)
        ]
        assert not down, f"services no longer SERVING at {down}"
        answer = self.call(
            _SEARCH + "Search", search_pb2.SearchRequest(tenant_id=VICTIM, query=_VICTIM_QUERY)
        )
        assert answer.code == grpc.StatusCode.OK, answer


def register_victim(services: Services, watch: BusWatch) -> None:
    """Three tools, a capability over two of them, one execution of it and a document, all
    processed."""
    tools = [
        common_pb2.Tool(
            id=tool_id,
            server=tool_id.partition(":")[0],
            name=tool_id.partition(":")[2],
            description=f"{tool_id.replace(':', ' ').replace('_', ' ')} ({VICTIM_MARK})",
            input_schema_json=json.dumps({"type": "object", "properties": {"path": {}}}),
        )
        for tool_id in VICTIM_TOOLS
    ]
    capability = common_pb2.Capability(
        id=VICTIM_CAPABILITY,
        name="open the vault and read",
        description=f"opens the vault, then reads the secret ({VICTIM_MARK})",
        tools=VICTIM_TOOLS[:2],
    )
    document = ingest_pb2.Document(
        id=VICTIM_DOCUMENT,
        title="Vault manual",
        text="# Vault\n\nThe vault opens with the brass key. The secret is kept in the vault "
        f"behind the second door ({VICTIM_MARK}).\n\n## Keys\n\nThe brass key opens the vault.",
    )
    for path, request in (
        (
            _SEARCH + "RegisterTools",
            search_pb2.RegisterToolsRequest(tenant_id=VICTIM, tools=tools),
        ),
        (
            _SEARCH + "RegisterCapabilities",
            search_pb2.RegisterCapabilitiesRequest(tenant_id=VICTIM, capabilities=[capability]),
        ),
        (_INGEST + "Submit", ingest_pb2.SubmitRequest(tenant_id=VICTIM, documents=[document])),
    ):
        answer = services.call(path, request)
        assert answer.code == grpc.StatusCode.OK, answer
    run = ExecutionCompleted.create(
        tenant_id=VICTIM,
        intent=_VICTIM_QUERY,
        steps=[ExecutionStep(node_id=t, success=True) for t in VICTIM_TOOLS[:2]],
        outcome="success",
        capability_id=VICTIM_CAPABILITY,
    )
    watch.append(ExecutionCompleted.STREAM, {EVENT_FIELD: run.to_json().encode()})

    def executed() -> bool:
        answer = services.node(VICTIM, VICTIM_TOOLS[0])
        return search_pb2.SearchResult.FromString(answer.reply).executions == 1

    def ingested() -> bool:
        answer = services.call(_INGEST + "GetStatus", ingest_pb2.GetStatusRequest(tenant_id=VICTIM))
        statuses = ingest_pb2.GetStatusResponse.FromString(answer.reply).documents
        return all(p.state == "done" for s in statuses for p in s.passes)

    until(executed, 90, "the victim's execution counted")
    until(ingested, 120, "the victim's document ingested")
    until(watch.quiet, 90, "every running group caught up")


@dataclass(frozen=True)
class VictimState(Terse):
    """The victim's data as every read RPC shows it, serialised (timings left out)."""

    replies: dict[str, bytes]


def victim_state(services: Services) -> VictimState:
    """What the victim's reads answer now."""
    reads: dict[str, tuple[str, Message]] = {
        f"GetNode {node}": (
            _SEARCH + "GetNode",
            search_pb2.GetNodeRequest(tenant_id=VICTIM, id=node),
        )
        for node in (*VICTIM_TOOLS, VICTIM_CAPABILITY)
    }
    reads |= {
        "Search": (
            _SEARCH + "Search",
            search_pb2.SearchRequest(tenant_id=VICTIM, query=_VICTIM_QUERY),
        ),
        "SearchTools": (
            _SEARCH + "SearchTools",
            search_pb2.SearchToolsRequest(
                tenant_id=VICTIM,
                query=_VICTIM_QUERY,
                context_tools=[VICTIM_TOOLS[0]],
                include_related=True,
            ),
        ),
        "ScoreTools": (
            _SCORER + "ScoreTools",
            scorer_pb2.ScoreRequest(tenant_id=VICTIM, text=_VICTIM_QUERY),
        ),
        "ScoreCapabilities": (
            _SCORER + "ScoreCapabilities",
            scorer_pb2.ScoreRequest(tenant_id=VICTIM, text=_VICTIM_QUERY),
        ),
        "ModelInfo": (_SCORER + "ModelInfo", scorer_pb2.ModelInfoRequest(tenant_id=VICTIM)),
        "GetStatus": (_INGEST + "GetStatus", ingest_pb2.GetStatusRequest(tenant_id=VICTIM)),
        "Ask": (
            _ASK,
            knowledge_pb2.AskRequest(tenant_id=VICTIM, question="Which key opens the vault?"),
        ),
    }
    replies = wire.methods()
    state: dict[str, bytes] = {}
    for name, (path, request) in reads.items():
        answer = services.call(path, request)
        assert answer.code == grpc.StatusCode.OK, (name, answer)
        reply = replies[path].FromString(answer.reply)
        if "timings" in reply.DESCRIPTOR.fields_by_name:
            reply.ClearField("timings")
        state[name] = reply.SerializeToString(deterministic=True)
    return VictimState(state)
