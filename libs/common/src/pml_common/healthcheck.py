"""`python -m pml_common.healthcheck HOST:PORT`: exit 0 when the gRPC server is SERVING.

Container healthchecks use it, since the images ship no grpc_health_probe binary. It reads the
same `PML_*` settings as the services, so it speaks TLS (and presents the client certificate
under mutual TLS) when they do; health needs no bearer token.
"""

from __future__ import annotations

import sys

import grpc  # type: ignore[import-untyped, unused-ignore]
from grpc_health.v1 import health_pb2, health_pb2_grpc

from pml_common.grpc_client import blocking_channel
from pml_common.settings import Settings


def check(address: str, timeout: float = 3.0, settings: Settings | None = None) -> bool:
    """Whether the server at `address` is SERVING; `settings` give TLS (plaintext without)."""
    with blocking_channel(address, settings or _PLAINTEXT, traced=False) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        try:
            reply = stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=timeout)
        except grpc.RpcError:
            return False
    return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


#: Settings of a plaintext probe without a token, whatever the environment says.
_PLAINTEXT = Settings.model_construct(
    tls_enabled=False, auth_token=None, grpc_max_message_bytes=4 * 1024 * 1024
)


if __name__ == "__main__":
    sys.exit(0 if len(sys.argv) == 2 and check(sys.argv[1], settings=Settings()) else 1)
