"""Composition root of the ingest service.

The contract (`proto/pml/v1/ingest.proto`) is served with health and reflection; its RPCs are
not built yet and answer UNIMPLEMENTED (the generated base servicer's behaviour).
"""

from __future__ import annotations

from pml.v1 import ingest_pb2_grpc
from pml_common.lifecycle import serve_contract


def main() -> None:
    serve_contract(
        "ingest",
        lambda settings: settings.ingest_port,
        ingest_pb2_grpc.add_IngestServiceServicer_to_server,
        ingest_pb2_grpc.IngestServiceServicer(),
        "pml.v1.IngestService",
    )
