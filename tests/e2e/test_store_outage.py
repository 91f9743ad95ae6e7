"""Redis or Neo4j briefly unavailable: gRPC answers UNAVAILABLE, then service resumes without
a restart. The system here has its own Redis and Neo4j, so stopping them disturbs no other test."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator

import grpc
import pytest

from pml.v1 import common_pb2, search_pb2, search_pb2_grpc
from pml_cli.local_stack import LocalStack
from pml_common.local_runtime import ManagedProcess, restart

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def own_stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalStack]:
    stack = LocalStack.on_free_ports(tmp_path_factory.mktemp("outage"), log_format="console")
    try:
        stack.start_stores()
        stack.start_services(["search", "trainer"])
        yield stack
    finally:
        stack.stop()


def _store(stack: LocalStack, name: str) -> ManagedProcess:
    return next(p for p in stack.processes if p.name == name)


def _replace(stack: LocalStack, old: ManagedProcess, new: ManagedProcess) -> None:
    stack.processes[stack.processes.index(old)] = new


def _tool(name: str) -> common_pb2.Tool:
    return common_pb2.Tool(
        id=f"fs:{name}", server="fs", name=name, description=f"{name.replace('_', ' ')} on disk"
    )


def _status(call) -> grpc.StatusCode | None:
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()
    return None


def _until_ok(call, timeout: float = 60.0):
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE or time.monotonic() > deadline:
                raise
            time.sleep(0.5)


def test_redis_outage_is_unavailable_then_recovers(own_stack: LocalStack) -> None:
    tenant = f"o-{uuid.uuid4().hex[:8]}"
    with grpc.insecure_channel(own_stack.settings.search_addr) as channel:
        stub = search_pb2_grpc.SearchServiceStub(channel)
        register = lambda tools: stub.RegisterTools(  # noqa: E731
            search_pb2.RegisterToolsRequest(tenant_id=tenant, tools=tools), timeout=30
        )
        register([_tool("read_file")])
        redis = _store(own_stack, "redis")
        redis.stop()
        started = time.monotonic()
        assert _status(lambda: register([_tool("write_file")])) == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - started < 15, "UNAVAILABLE should come quickly"
        _replace(own_stack, redis, restart(redis))
        _until_ok(lambda: register([_tool("write_file")]))
        reply = stub.Search(
            search_pb2.SearchRequest(tenant_id=tenant, query="write a file"), timeout=30
        )
    assert reply.results[0].id == "fs:write_file"


def test_neo4j_outage_is_unavailable_then_recovers(own_stack: LocalStack) -> None:
    tenant = f"o-{uuid.uuid4().hex[:8]}"
    with grpc.insecure_channel(own_stack.settings.search_addr) as channel:
        stub = search_pb2_grpc.SearchServiceStub(channel)
        stub.RegisterTools(
            search_pb2.RegisterToolsRequest(tenant_id=tenant, tools=[_tool("list_directory")]),
            timeout=30,
        )
        search = lambda: stub.Search(  # noqa: E731
            search_pb2.SearchRequest(tenant_id=tenant, query="list a folder"), timeout=30
        )
        neo4j = _store(own_stack, "neo4j")
        neo4j.stop()
        # A tenant whose graph statistics are not cached yet needs Neo4j.
        fresh = f"o-{uuid.uuid4().hex[:8]}"
        started = time.monotonic()
        code = _status(
            lambda: stub.Search(
                search_pb2.SearchRequest(tenant_id=fresh, query="list a folder"), timeout=30
            )
        )
        assert code == grpc.StatusCode.UNAVAILABLE
        assert time.monotonic() - started < 15, "UNAVAILABLE should come quickly"
        _replace(own_stack, neo4j, restart(neo4j))
        reply = _until_ok(search)
    assert reply.results[0].id == "fs:list_directory"
