"""Scorer, planner and ingest serve their contracts: healthy, reflected, RPCs UNIMPLEMENTED."""

from __future__ import annotations

import grpc
import pytest

from pml.v1 import (
    ingest_pb2,
    ingest_pb2_grpc,
    planner_pb2,
    planner_pb2_grpc,
    scorer_pb2,
    scorer_pb2_grpc,
)
from pml_cli.local_stack import LocalStack

pytestmark = pytest.mark.e2e

CALLS = {
    "scorer": lambda ch: scorer_pb2_grpc.ScorerServiceStub(ch).ModelInfo(
        scorer_pb2.ModelInfoRequest(), timeout=10
    ),
    "planner": lambda ch: planner_pb2_grpc.PlannerServiceStub(ch).SuggestDag(
        planner_pb2.SuggestDagRequest(intent="deploy my app"), timeout=10
    ),
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
