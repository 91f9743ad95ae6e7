"""Composition root of the scorer service.

The contract (`proto/pml/v1/scorer.proto`) is served with health and reflection; its RPCs are
not built yet and answer UNIMPLEMENTED (the generated base servicer's behaviour).
"""

from __future__ import annotations

from pml.v1 import scorer_pb2_grpc
from pml_common.lifecycle import serve_contract


def main() -> None:
    serve_contract(
        "scorer",
        lambda settings: settings.scorer_port,
        scorer_pb2_grpc.add_ScorerServiceServicer_to_server,
        scorer_pb2_grpc.ScorerServiceServicer(),
        "pml.v1.ScorerService",
    )
