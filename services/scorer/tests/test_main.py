"""`python -m pml_scorer` as a real process: serves, answers, stops cleanly on SIGTERM."""

from __future__ import annotations

import signal
from pathlib import Path

import grpc

from pml.v1 import scorer_pb2, scorer_pb2_grpc
from pml_common.testing import service_process


def test_module_serves_and_shuts_down_gracefully(
    settings_env: dict[str, str], tmp_path: Path, tenant: str
) -> None:
    with service_process(
        "pml_scorer", "PML_SCORER_PORT", settings_env, tmp_path / "scorer.log"
    ) as service:
        proc, address, log = service.proc, service.address, service.log
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
