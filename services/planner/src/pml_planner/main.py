"""Composition root of the planner service.

The contract (`proto/pml/v1/planner.proto`) is served with health and reflection; its RPCs are
not built yet and answer UNIMPLEMENTED (the generated base servicer's behaviour).
"""

from __future__ import annotations

from pml.v1 import planner_pb2_grpc
from pml_common.lifecycle import serve_contract


def main() -> None:
    serve_contract(
        "planner",
        lambda settings: settings.planner_port,
        planner_pb2_grpc.add_PlannerServiceServicer_to_server,
        planner_pb2_grpc.PlannerServiceServicer(),
        "pml.v1.PlannerService",
    )
