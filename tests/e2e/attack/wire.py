"""The services' RPCs as the wire sees them: every method of the public protos, called with a
message or with raw bytes, and hostile protobuf bytes as hypothesis strategies."""

from __future__ import annotations

from dataclasses import dataclass

import grpc
from google.protobuf import message_factory
from google.protobuf.message import Message
from hypothesis import strategies as st

from pml.v1 import ingest_pb2, knowledge_pb2, planner_pb2, scorer_pb2, search_pb2
from pml_common.settings import Settings

#: Every answer a hostile request may get: a result, or an error that says what was wrong.
#: INTERNAL or UNKNOWN would be a crash; UNAVAILABLE a dependency down (none is, here).
CLEAR_CODES = frozenset(
    {
        grpc.StatusCode.OK,
        grpc.StatusCode.INVALID_ARGUMENT,
        grpc.StatusCode.NOT_FOUND,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
    }
)

#: How long one attack call may take: a 100,000-character intent is embedded (cut) and
#: planned on a loaded machine; a crash answers at once, so this only bounds a hang.
CALL_TIMEOUT_S = 60


@dataclass(frozen=True)
class Answer:
    code: grpc.StatusCode
    details: str
    reply: bytes  # the serialised reply when OK, else empty


def methods() -> dict[str, type[Message]]:
    """Path (`/pml.v1.Service/Method`) -> reply class, for every RPC of the public services."""
    found: dict[str, type[Message]] = {}
    for module in (search_pb2, knowledge_pb2, scorer_pb2, planner_pb2, ingest_pb2):
        for service in module.DESCRIPTOR.services_by_name.values():
            for method in service.methods:
                reply = message_factory.GetMessageClass(method.output_type)
                found[f"/{service.full_name}/{method.name}"] = reply
    return found


def addresses(settings: Settings) -> dict[str, str]:
    """Service name -> address of the server that serves it."""
    return {
        "pml.v1.SearchService": settings.search_addr,
        "pml.v1.KnowledgeService": settings.search_addr,
        "pml.v1.ScorerService": settings.scorer_addr,
        "pml.v1.PlannerService": settings.planner_addr,
        "pml.v1.IngestService": settings.ingest_addr,
    }


def service_of(path: str) -> str:
    return path.split("/")[1]


def call(channel: grpc.Channel, path: str, request: Message | bytes) -> Answer:
    """Send `request` (a message, or bytes sent as they are) and return how it was answered."""
    payload = request if isinstance(request, bytes) else request.SerializeToString()
    send = channel.unary_unary(path)  # no serializers: bytes both ways
    try:
        reply: bytes = send(payload, timeout=CALL_TIMEOUT_S)
    except grpc.RpcError as exc:
        return Answer(exc.code(), exc.details() or "", b"")
    return Answer(grpc.StatusCode.OK, "", reply)


# --- hostile protobuf bytes ---------------------------------------------------------------------


def varint(value: int) -> bytes:
    """Protobuf base-128 varint; values past 64 bits give the over-long varints parsers refuse."""
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def tag(field: int, wire_type: int) -> bytes:
    return varint((field << 3) | wire_type)


def _field(field: int, wire_type: int, value: int, body: bytes, declared: int | None) -> bytes:
    """One field of any wire type (6 and 7 do not exist), a length that may lie included."""
    head = tag(field, wire_type)
    if wire_type == 0:
        return head + varint(value)
    if wire_type == 1:
        return head + body[:8].ljust(8, b"\0")
    if wire_type == 2:
        return head + varint(len(body) if declared is None else declared) + body
    if wire_type == 5:
        return head + body[:4].ljust(4, b"\0")
    return head + body  # groups (3, 4) and the wire types that do not exist


_fields = st.builds(
    _field,
    st.one_of(st.sampled_from((0, 1, 2, 3, 4, 5, 15, 99, 2**29 - 1)), st.integers(0, 2**32)),
    st.integers(0, 7),
    st.integers(0, 2**80),
    st.one_of(st.binary(max_size=24), st.sampled_from((b"\xc3\x28", b"\xff\xfe", b"\xed\xa0\x80"))),
    st.one_of(st.none(), st.sampled_from((0, 1, 2**31, 2**63)), st.integers(0, 64)),
)


def nested_groups(depth: int) -> bytes:
    """An unknown field (15) of `depth` nested groups: parsed recursively by protobuf."""
    return tag(15, 3) * depth + tag(15, 4) * depth


def nested_tools(depth: int) -> bytes:
    """RegisterToolsRequest.tools (field 2) wrapping itself `depth` times: each level is a Tool
    whose field 2 (server, a string) holds bytes that are again a length-delimited field."""
    body = b"\x0a\x03a:b"
    for _ in range(depth):
        body = b"\x12" + varint(len(body)) + body
    return body


raw_payloads: st.SearchStrategy[bytes] = st.one_of(
    st.binary(max_size=64),
    st.lists(_fields, max_size=6).map(b"".join),
    st.sampled_from((1, 99, 100, 101, 1_000, 100_000)).map(nested_groups),
    st.sampled_from((2, 64, 1_000)).map(nested_tools),
    st.just(b"\x0a" + varint(9 * 1024 * 1024) + b"x" * (9 * 1024 * 1024)),  # past 8 MiB
    st.just(b"\x0a" + varint(2**31) + b"ab"),  # a length far past the end
)
