"""Redis or Neo4j unavailable: gRPC answers UNAVAILABLE quickly, then service resumes without
a restart. The system here has its own Redis and Neo4j, so stopping them disturbs no other test.

Redis runs without persistence, so a restarted Redis is an emptied one: the consumer groups are
gone and the services must recreate them (NOGROUP) instead of stopping or crash-looping, and
handle the events published afterwards. Each drill prints its measured figures as one
`drill {...}` JSON line (`pytest -s` shows them); docs/operations.md, "Failure drills", records
them.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
import redis

from pml.v1 import common_pb2, search_pb2, search_pb2_grpc
from pml_cli.local_stack import LocalStack
from pml_common.events import ExecutionCompleted, ExecutionStep, Streams
from pml_common.local_runtime import ManagedProcess, restart
from pml_common.testing import until

pytestmark = pytest.mark.e2e


def report(drill: str, **figures: Any) -> None:
    print("drill " + json.dumps({"drill": drill, **figures}), flush=True)


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


def _executions(stub: search_pb2_grpc.SearchServiceStub, tenant: str, tool: str) -> int:
    # The drill's other calls' deadline: on a loaded machine the first read of the tenant's
    # graph after the restart has taken more than 10 s.
    node = stub.GetNode(search_pb2.GetNodeRequest(tenant_id=tenant, id=tool), timeout=30)
    return node.executions


def _services(stack: LocalStack) -> dict[str, ManagedProcess]:
    return {p.name: p for p in stack.processes if p.name in ("search", "trainer")}


def _log_count(proc: ManagedProcess, event: str) -> int:
    return proc.log_path.read_text(errors="replace").count(event)


def test_redis_restarted_empty_is_unavailable_then_groups_are_recreated(
    own_stack: LocalStack,
) -> None:
    tenant = f"o-{uuid.uuid4().hex[:8]}"
    services = _services(own_stack)
    pids = {name: proc.pid for name, proc in services.items()}
    with grpc.insecure_channel(own_stack.settings.search_addr) as channel:
        stub = search_pb2_grpc.SearchServiceStub(channel)
        register = lambda tools: stub.RegisterTools(  # noqa: E731
            search_pb2.RegisterToolsRequest(tenant_id=tenant, tools=tools), timeout=30
        )
        register([_tool("read_file")])
        redis_proc = _store(own_stack, "redis")
        redis_proc.stop()
        started = time.monotonic()
        assert _status(lambda: register([_tool("write_file")])) == grpc.StatusCode.UNAVAILABLE
        unavailable_s = time.monotonic() - started
        assert unavailable_s < 15, "UNAVAILABLE should come quickly"
        _replace(own_stack, redis_proc, restart(redis_proc))
        restarted = time.monotonic()
        client = redis.Redis.from_url(own_stack.settings.redis_url)
        # The services may already have recreated their (empty) streams and groups: what
        # shows the data is gone is the first registration's event.
        assert client.xlen(Streams.TOOLS_REGISTERED) == 0, "the restarted Redis starts empty"
        _until_ok(lambda: register([_tool("write_file")]))
        grpc_back = time.monotonic()
        # An event published after the restart reaches the trainer through a recreated group,
        # and its effect reaches search through search's recreated group for GraphChanged.
        execution = ExecutionCompleted.create(
            tenant_id=tenant,
            intent="write a file",
            steps=[ExecutionStep(node_id="fs:write_file", success=True)],
            outcome="success",
        )
        client.xadd(Streams.EXECUTION_COMPLETED, {"data": execution.to_json()})
        handled = until(
            lambda: _executions(stub, tenant, "fs:write_file") == 1, 60, "the execution counted"
        )
        reply = stub.Search(
            search_pb2.SearchRequest(tenant_id=tenant, query="write a file"), timeout=30
        )
        groups = {
            info["name"].decode() for info in client.xinfo_groups(Streams.EXECUTION_COMPLETED)
        }
        client.close()
    assert reply.results[0].id == "fs:write_file"
    assert "trainer" in groups
    # No crash loop: the very processes started before the outage still serve.
    assert {name: proc.pid for name, proc in services.items()} == pids
    assert all(proc.alive() for proc in services.values())
    restarts = {name: _log_count(proc, "bus.consumer_restarted") for name, proc in services.items()}
    report(
        "redis_restarted_empty",
        time_to_unavailable_s=round(unavailable_s, 2),
        grpc_resumed_after_restart_s=round(grpc_back - restarted, 2),
        event_handled_after_restart_s=round(handled - restarted, 2),
        consumers_restarted=restarts,
    )


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
        unavailable_s = time.monotonic() - started
        assert code == grpc.StatusCode.UNAVAILABLE
        assert unavailable_s < 15, "UNAVAILABLE should come quickly"
        restarting = time.monotonic()
        _replace(own_stack, neo4j, restart(neo4j))
        back = time.monotonic()
        reply = _until_ok(search)
        resumed = time.monotonic()
    assert reply.results[0].id == "fs:list_directory"
    report(
        "neo4j_stopped",
        time_to_unavailable_s=round(unavailable_s, 2),
        neo4j_restart_s=round(back - restarting, 2),
        service_resumed_after_neo4j_back_s=round(resumed - back, 2),
    )
