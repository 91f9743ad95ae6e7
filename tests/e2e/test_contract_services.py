"""Ingest serves its contract (healthy, reflected, RPCs UNIMPLEMENTED); the scorer, built
since, answers for real (the planner has its own end-to-end tests)."""

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

CALLS = {
    "ingest": lambda ch: ingest_pb2_grpc.IngestServiceStub(ch).GetStatus(
        ingest_pb2.GetStatusRequest(), timeout=10
    ),
}


@pytest.mark.parametrize("service", sorted(CALLS))
def test_contract_only_services_answer_unimplemented(stack: LocalStack, service: str) -> None:
    stack.start_services([service])  # waits for its health check to answer SERVING
    address = stack.processes[-1].url
    with grpc.insecure_channel(address) as channel, pytest.raises(grpc.RpcError) as info:
        CALLS[service](channel)
    assert info.value.code() == grpc.StatusCode.UNIMPLEMENTED


def test_scorer_answers_model_info_for_an_empty_tenant(stack: LocalStack) -> None:
    stack.start_services(["scorer"])  # waits for its health check to answer SERVING
    address = stack.processes[-1].url
    with grpc.insecure_channel(address) as channel:
        info = scorer_pb2_grpc.ScorerServiceStub(channel).ModelInfo(
            scorer_pb2.ModelInfoRequest(tenant_id=f"e2e-empty-{uuid.uuid4().hex[:8]}"), timeout=30
        )
    assert info.version == "untrained"
    assert (info.num_tools, info.num_capabilities, info.num_levels) == (0, 0, 0)
