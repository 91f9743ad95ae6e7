"""`python -m pml_search` as a real process: serves, answers health, stops cleanly on SIGTERM."""

from __future__ import annotations

import signal
from pathlib import Path

import grpc

from pml.v1 import knowledge_pb2, knowledge_pb2_grpc, search_pb2, search_pb2_grpc
from pml_common.testing import service_process


def test_module_serves_and_shuts_down_gracefully(
    settings_env: dict[str, str], tmp_path: Path, tenant: str
) -> None:
    with service_process(
        "pml_search", "PML_SEARCH_PORT", settings_env, tmp_path / "search.log"
    ) as service:
        proc, address, log = service.proc, service.address, service.log
        with grpc.insecure_channel(address) as channel:
            search = search_pb2_grpc.SearchServiceStub(channel)
            reply = search.Search(
                search_pb2.SearchRequest(tenant_id=tenant, query="anything"), timeout=30
            )
            assert list(reply.results) == []
            ask = knowledge_pb2_grpc.KnowledgeServiceStub(channel)
            answer = ask.Ask(
                knowledge_pb2.AskRequest(tenant_id=tenant, question="why?"), timeout=30
            )
            assert answer.mode == knowledge_pb2.ANSWER_MODE_TEXT_ONLY and not answer.chunks
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0, log.read_text()[-3000:]
        assert "search stopped" in log.read_text()
