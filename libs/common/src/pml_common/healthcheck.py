"""`python -m pml_common.healthcheck HOST:PORT`: exit 0 when the gRPC server is SERVING.

Container healthchecks use it, since the images ship no grpc_health_probe binary.
"""

from __future__ import annotations

import sys

import grpc  # type: ignore[import-untyped, unused-ignore]
from grpc_health.v1 import health_pb2, health_pb2_grpc


def check(address: str, timeout: float = 3.0) -> bool:
    with grpc.insecure_channel(address) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


if __name__ == "__main__":
    sys.exit(0 if len(sys.argv) == 2 and check(sys.argv[1]) else 1)
