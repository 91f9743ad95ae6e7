"""Bad input gets a clear gRPC error and loses nothing already stored."""

from __future__ import annotations

import grpc
import pytest

from pml.v1 import common_pb2, search_pb2

pytestmark = pytest.mark.e2e


def _code(call) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as info:
        call()
    return info.value.code(), info.value.details()


@pytest.fixture
def catalog(search_stub, e2e_tenant: str) -> str:
    tools = [
        common_pb2.Tool(
            id="fs:read_file",
            server="fs",
            name="read_file",
            description="Read the complete contents of a file",
        ),
        common_pb2.Tool(
            id="fs:write_file",
            server="fs",
            name="write_file",
            description="Create or overwrite a file with new content",
        ),
    ]
    search_stub.RegisterTools(
        search_pb2.RegisterToolsRequest(tenant_id=e2e_tenant, tools=tools), timeout=60
    )
    return e2e_tenant


@pytest.mark.parametrize(
    ("request_fields", "fragment"),
    [
        ({"query": ""}, "query"),
        ({"query": "   "}, "query"),
        ({"query": "x" * 100_001}, "query"),
        ({"query": "read", "limit": -1}, "limit"),
        ({"query": "read", "limit": 10_000}, "limit"),
    ],
)
def test_search_rejects_bad_requests(
    search_stub, catalog: str, request_fields: dict, fragment: str
) -> None:
    code, details = _code(
        lambda: search_stub.Search(
            search_pb2.SearchRequest(tenant_id=catalog, **request_fields), timeout=10
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert fragment in details.lower()


def test_search_tools_unknown_context_is_not_found(search_stub, catalog: str) -> None:
    code, details = _code(
        lambda: search_stub.SearchTools(
            search_pb2.SearchToolsRequest(
                tenant_id=catalog, query="write", context_tools=["nope:missing"]
            ),
            timeout=10,
        )
    )
    assert code == grpc.StatusCode.NOT_FOUND
    assert "nope:missing" in details


def test_get_unknown_node_is_not_found(search_stub, catalog: str) -> None:
    code, details = _code(
        lambda: search_stub.GetNode(
            search_pb2.GetNodeRequest(tenant_id=catalog, id="fs:nothing"), timeout=10
        )
    )
    assert code == grpc.StatusCode.NOT_FOUND
    assert "fs:nothing" in details


def test_bad_registration_stores_nothing(search_stub, catalog: str) -> None:
    batch = [
        common_pb2.Tool(
            id="fs:list_directory", server="fs", name="list_directory", description="List a folder"
        ),
        common_pb2.Tool(id="no colon here", server="fs", name="broken", description="bad id"),
    ]
    code, details = _code(
        lambda: search_stub.RegisterTools(
            search_pb2.RegisterToolsRequest(tenant_id=catalog, tools=batch), timeout=30
        )
    )
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert "no colon here" in details
    # nothing of the bad batch was stored, and what was there before is intact
    code, _ = _code(
        lambda: search_stub.GetNode(
            search_pb2.GetNodeRequest(tenant_id=catalog, id="fs:list_directory"), timeout=10
        )
    )
    assert code == grpc.StatusCode.NOT_FOUND
    reply = search_stub.Search(
        search_pb2.SearchRequest(tenant_id=catalog, query="read a file", limit=5), timeout=10
    )
    assert reply.results[0].id == "fs:read_file"


def test_deadline_is_honoured(search_stub, catalog: str) -> None:
    code, _ = _code(
        lambda: search_stub.Search(
            search_pb2.SearchRequest(tenant_id=catalog, query="read a file"), timeout=0.0001
        )
    )
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED


def test_reflection_and_health_are_on(e2e_settings) -> None:
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    with grpc.insecure_channel(e2e_settings.search_addr) as channel:
        health = health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(service="pml.v1.SearchService"), timeout=5
        )
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)
        replies = stub.ServerReflectionInfo(
            iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=5
        )
        names = {s.name for r in replies for s in r.list_services_response.service}
    assert {"pml.v1.SearchService", "pml.v1.KnowledgeService"} <= names


def test_knowledge_ask_refuses_bad_input(e2e_settings) -> None:
    from pml.v1 import knowledge_pb2, knowledge_pb2_grpc

    with grpc.insecure_channel(e2e_settings.search_addr) as channel:
        stub = knowledge_pb2_grpc.KnowledgeServiceStub(channel)
        code, message = _code(lambda: stub.Ask(knowledge_pb2.AskRequest(), timeout=30))
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "question" in message
        code, message = _code(
            lambda: stub.Ask(knowledge_pb2.AskRequest(question="why?", k=99), timeout=30)
        )
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "k must be" in message
        answer = stub.Ask(knowledge_pb2.AskRequest(question="why?"), timeout=30)
    assert answer.mode == knowledge_pb2.ANSWER_MODE_TEXT_ONLY  # nothing ingested: text only


@pytest.mark.parametrize(
    ("raw", "what"),
    [
        (b"\x0a\x05ab", "truncated"),  # tenant_id claims 5 bytes, 2 follow
        (b"\x12\x02\xff\xfe", "invalid UTF-8"),  # query holds bytes that are not UTF-8
        (b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff\xff", "garbage"),
    ],
)
def test_malformed_protobuf_is_invalid_argument(e2e_settings, stack, raw: bytes, what: str) -> None:
    """A request that does not decode answered UNKNOWN, with a traceback in the log."""
    with grpc.insecure_channel(e2e_settings.search_addr) as channel:
        search = channel.unary_unary("/pml.v1.SearchService/Search")
        code, details = _code(lambda: search(raw, timeout=10))
    assert code == grpc.StatusCode.INVALID_ARGUMENT, (what, code, details)
    assert "could not be decoded as pml.v1.SearchRequest" in details
    log = (stack.state_dir / "logs" / "search.log").read_text(errors="replace")
    assert "DecodeError" not in log
