"""`python -m pml_scorer` as a real process: serves, answers, stops cleanly on SIGTERM."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pml.v1 import scorer_pb2, scorer_pb2_grpc


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
                    health_pb2.HealthCheckRequest(service="pml.v1.ScorerService"), timeout=2
                )
                if reply.status == health_pb2.HealthCheckResponse.SERVING:
                    return
            except grpc.RpcError:
                pass
            time.sleep(0.2)
    raise AssertionError("scorer never became SERVING:\n" + log.read_text()[-3000:])


def test_module_serves_and_shuts_down_gracefully(
    settings_env: dict[str, str], tmp_path: Path, tenant: str
) -> None:
    port = _free_port()
    env = {**settings_env, "PML_SCORER_PORT": str(port)}
    log = tmp_path / "scorer.log"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pml_scorer"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        address = f"127.0.0.1:{port}"
        _wait_serving(address, proc, log)
        with grpc.insecure_channel(address) as channel:
            scorer = scorer_pb2_grpc.ScorerServiceStub(channel)
            info = scorer.ModelInfo(scorer_pb2.ModelInfoRequest(tenant_id=tenant), timeout=30)
            assert (info.version, info.num_tools) == ("untrained", 0)
            reply = scorer.ScoreCapabilities(
                scorer_pb2.ScoreRequest(tenant_id=tenant, text="anything"), timeout=30
            )
            assert list(reply.scores) == []
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
        assert "scorer stopped" in log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
