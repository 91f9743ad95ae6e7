"""`python -m pml_search` as a real process: serves, answers health, stops cleanly on SIGTERM."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pml.v1 import knowledge_pb2, knowledge_pb2_grpc, search_pb2, search_pb2_grpc


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_serving(address: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            assert proc.poll() is None, log.read_text(errors="replace")[-3000:]
            try:
                reply = stub.Check(
                    health_pb2.HealthCheckRequest(service="pml.v1.SearchService"), timeout=2
                )
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise AssertionError("search never became SERVING:\n" + log.read_text()[-3000:])


def test_module_serves_and_shuts_down_gracefully(
    settings_env: dict[str, str], tmp_path: Path, tenant: str
) -> None:
    port = _free_port()
    env = {**settings_env, "PML_SEARCH_PORT": str(port)}
    log = tmp_path / "search.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pml_search"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        address = f"127.0.0.1:{port}"
        _wait_serving(address, proc, log)
        with grpc.insecure_channel(address) as channel:
            search = search_pb2_grpc.SearchServiceStub(channel)
            reply = search.Search(
                search_pb2.SearchRequest(tenant_id=tenant, query="anything"), timeout=30
            )
            assert list(reply.results) == []
            ask = knowledge_pb2_grpc.KnowledgeServiceStub(channel)
            try:
                ask.Ask(knowledge_pb2.AskRequest(question="why?"), timeout=10)
                raise AssertionError("Ask should not be implemented yet")
            except grpc.RpcError as exc:
                assert exc.code() == grpc.StatusCode.UNIMPLEMENTED
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
        assert "search stopped" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
