"""Services answer for real once started by the local stack: ingest (with its pass workers)
and the scorer (the planner and the knowledge side have their own end-to-end tests)."""

from __future__ import annotations

import uuid

import grpc
import pytest

from pml.v1 import (
    ingest_pb2,
    ingest_pb2_grpc,
    scorer_pb2,
    scorer_pb2_grpc,
)
from pml_cli.local_stack import LocalStack

pytestmark = pytest.mark.e2e


def test_ingest_answers_get_status_for_an_empty_tenant(stack: LocalStack) -> None:
    stack.start_services(["ingest"])  # the service and its pass workers, each SERVING
    [ingest] = [p for p in stack.processes if p.name == "ingest"]
    with grpc.insecure_channel(ingest.url) as channel:
        reply = ingest_pb2_grpc.IngestServiceStub(channel).GetStatus(
            ingest_pb2.GetStatusRequest(tenant_id=f"e2e-empty-{uuid.uuid4().hex[:8]}"), timeout=10
        )
    assert list(reply.documents) == []
    assert {p.name for p in stack.processes} >= {
        f"ingest-{name}" for name in ("chunking", "pass1", "pass2a", "pass2b", "pass3")
    }


def test_scorer_answers_model_info_for_an_empty_tenant(stack: LocalStack) -> None:
    stack.start_services(["scorer"])  # waits for its health check to answer SERVING
    address = stack.processes[-1].url
    with grpc.insecure_channel(address) as channel:
        info = scorer_pb2_grpc.ScorerServiceStub(channel).ModelInfo(
            scorer_pb2.ModelInfoRequest(tenant_id=f"e2e-empty-{uuid.uuid4().hex[:8]}"), timeout=30
        )
    assert info.version == "untrained"
    assert (info.num_tools, info.num_capabilities, info.num_levels) == (0, 0, 0)
