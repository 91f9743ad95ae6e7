"""TLS, mutual TLS and bearer tokens on a real GrpcServer, with a throwaway PKI.

Servers and clients are built from `Settings` exactly as the services and the `pml` command
build them (GrpcServer, grpc_client.channel / blocking_channel, healthcheck.check).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import grpc
import pytest
import structlog
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from pydantic import SecretStr

from pml.v1 import search_pb2, search_pb2_grpc
from pml_common.grpc_client import blocking_channel, channel
from pml_common.grpc_security import (
    MIN_TOKEN_CHARS,
    SecurityConfigError,
    bearer_token_of,
    token_matches,
)
from pml_common.grpc_server import GrpcServer
from pml_common.healthcheck import check
from pml_common.settings import Settings
from pml_common.testing import TlsFiles, make_tls_files

SERVICE = "pml.v1.SearchService"
TOKEN = "7c1f0e9a4b2d48f3a6e5c0b9d8f7a6e5"
OTHER_TOKEN = "0123456789abcdef0123456789abcdef"


class Counting(search_pb2_grpc.SearchServiceServicer):
    """GetNode echoes the id and counts the calls that reached it."""

    def __init__(self) -> None:
        self.calls = 0

    async def GetNode(
        self, request: search_pb2.GetNodeRequest, context: grpc.aio.ServicerContext
    ) -> search_pb2.SearchResult:
        self.calls += 1
        return search_pb2.SearchResult(id=request.id)


def base_settings(**overrides: Any) -> Settings:
    return Settings(grpc_host="127.0.0.1", **overrides)


def server_tls(tls: TlsFiles, **overrides: Any) -> Settings:
    files = {
        "tls_cert_file": str(tls.server_cert),
        "tls_key_file": str(tls.server_key),
        "tls_ca_file": str(tls.ca),
    }
    return base_settings(tls_enabled=True, **{**files, **overrides})


def client_tls(tls: TlsFiles, **overrides: Any) -> Settings:
    return base_settings(tls_enabled=True, **{"tls_ca_file": str(tls.ca), **overrides})


@asynccontextmanager
async def serving(settings: Settings, servicer: Counting | None = None) -> AsyncIterator[str]:
    server = GrpcServer(settings, 0, "security-test")
    impl = servicer or Counting()
    server.add(lambda s: search_pb2_grpc.add_SearchServiceServicer_to_server(impl, s), SERVICE)
    port = await server.start()
    try:
        yield f"localhost:{port}"
    finally:
        await server.stop(0)


async def get_node(address: str, settings: Settings) -> search_pb2.SearchResult:
    async with channel(address, settings) as ch:
        stub = search_pb2_grpc.SearchServiceStub(ch)
        reply: search_pb2.SearchResult = await stub.GetNode(
            search_pb2.GetNodeRequest(id="fs:read"), timeout=5
        )
        return reply


async def refused(address: str, settings: Settings) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await get_node(address, settings)
    return err.value


# --- TLS ----------------------------------------------------------------------------------------


async def test_tls_server_serves_a_tls_client_and_refuses_a_plaintext_one(
    tls_files: TlsFiles,
) -> None:
    async with serving(server_tls(tls_files)) as address:
        assert (await get_node(address, client_tls(tls_files))).id == "fs:read"
        plaintext = await refused(address, base_settings())
        assert plaintext.code() == grpc.StatusCode.UNAVAILABLE


async def test_client_refuses_a_server_its_ca_did_not_sign(tls_files: TlsFiles) -> None:
    async with serving(server_tls(tls_files)) as address:
        distrustful = base_settings(tls_enabled=True, tls_ca_file=str(tls_files.other_ca))
        assert (await refused(address, distrustful)).code() == grpc.StatusCode.UNAVAILABLE


async def test_plaintext_server_refuses_a_tls_client(tls_files: TlsFiles) -> None:
    async with serving(base_settings()) as address:
        assert (await get_node(address, base_settings())).id == "fs:read"
        assert (await refused(address, client_tls(tls_files))).code() == (
            grpc.StatusCode.UNAVAILABLE
        )


async def test_server_name_override_checks_the_certificate_against_that_name(
    tmp_path: Path,
) -> None:
    """A certificate for a service name, reached by IP address (as a pod may be)."""
    named = make_tls_files(tmp_path, hosts=("search.pml.internal",))
    async with serving(server_tls(named)) as address:
        by_ip = "127.0.0.1:" + address.rsplit(":", 1)[1]
        assert (await refused(by_ip, client_tls(named))).code() == grpc.StatusCode.UNAVAILABLE
        expecting = client_tls(named, tls_server_name="search.pml.internal")
        assert (await get_node(by_ip, expecting)).id == "fs:read"
        wrong = client_tls(named, tls_server_name="scorer.pml.internal")
        assert (await refused(by_ip, wrong)).code() == grpc.StatusCode.UNAVAILABLE


async def test_mutual_tls_requires_a_client_certificate_of_the_ca(tls_files: TlsFiles) -> None:
    async with serving(server_tls(tls_files, tls_client_auth=True)) as address:
        anonymous = client_tls(tls_files)
        assert (await refused(address, anonymous)).code() == grpc.StatusCode.UNAVAILABLE
        stranger = client_tls(
            tls_files,
            tls_cert_file=str(tls_files.other_cert),
            tls_key_file=str(tls_files.other_key),
        )
        assert (await refused(address, stranger)).code() == grpc.StatusCode.UNAVAILABLE
        member = client_tls(
            tls_files,
            tls_client_auth=True,
            tls_cert_file=str(tls_files.client_cert),
            tls_key_file=str(tls_files.client_key),
        )
        assert (await get_node(address, member)).id == "fs:read"
        # A service presents its own certificate when it calls another service: it needs the
        # client usage as well as the server one.
        service = server_tls(tls_files, tls_client_auth=True)
        assert (await get_node(address, service)).id == "fs:read"
        server_only = client_tls(
            tls_files,
            tls_cert_file=str(tls_files.server_only_cert),
            tls_key_file=str(tls_files.server_only_key),
        )
        assert (await refused(address, server_only)).code() == grpc.StatusCode.UNAVAILABLE


async def test_health_check_speaks_tls_when_the_settings_do(tls_files: TlsFiles) -> None:
    async with serving(server_tls(tls_files)) as address:
        # Blocking probes run in a thread: this test's event loop serves them.
        assert await asyncio.to_thread(check, address, 3, client_tls(tls_files))
        assert not await asyncio.to_thread(check, address, 3)  # plaintext probe of TLS


def test_tls_without_a_certificate_stops_the_server_with_the_setting_named(
    tls_files: TlsFiles,
) -> None:
    with pytest.raises(SecurityConfigError, match="tls_cert_file must name a PEM file"):
        GrpcServer(base_settings(tls_enabled=True, tls_key_file=str(tls_files.server_key)), 0, "x")
    with pytest.raises(SecurityConfigError, match="tls_key_file: cannot read"):
        GrpcServer(server_tls(tls_files, tls_key_file="/nonexistent/key.pem"), 0, "x")
    with pytest.raises(SecurityConfigError, match="tls_ca_file must name a PEM file"):
        GrpcServer(server_tls(tls_files, tls_client_auth=True, tls_ca_file=""), 0, "x")


# --- bearer tokens ------------------------------------------------------------------------------


def auth_server(**overrides: Any) -> Settings:
    return base_settings(auth_enabled=True, auth_token=SecretStr(TOKEN), **overrides)


async def test_auth_denies_calls_without_a_token_before_the_servicer_runs() -> None:
    servicer = Counting()
    async with serving(auth_server(), servicer) as address:
        missing = await refused(address, base_settings())
        assert missing.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "authorization: Bearer <token>" in (missing.details() or "")
        assert servicer.calls == 0


async def test_auth_denies_a_wrong_token_and_admits_the_right_one() -> None:
    servicer = Counting()
    async with serving(auth_server(), servicer) as address:
        wrong = await refused(address, base_settings(auth_token=SecretStr(OTHER_TOKEN)))
        assert wrong.code() == grpc.StatusCode.UNAUTHENTICATED
        assert wrong.details() == "invalid bearer token"
        assert servicer.calls == 0
        assert (await get_node(address, base_settings(auth_token=SecretStr(TOKEN)))).id
        assert servicer.calls == 1


async def test_every_accepted_token_is_admitted_for_rotation() -> None:
    server = auth_server(auth_tokens=SecretStr(f"{OTHER_TOKEN}, {'r' * MIN_TOKEN_CHARS}\n"))
    async with serving(server) as address:
        for token in (TOKEN, OTHER_TOKEN, "r" * MIN_TOKEN_CHARS):
            assert (await get_node(address, base_settings(auth_token=SecretStr(token)))).id


async def test_health_and_reflection_need_no_token() -> None:
    async with serving(auth_server()) as address:
        assert await asyncio.to_thread(check, address, 3)
        async with channel(address, base_settings()) as ch:
            health = health_pb2_grpc.HealthStub(ch)
            reply = await health.Check(health_pb2.HealthCheckRequest(service=SERVICE))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
            reflection = reflection_pb2_grpc.ServerReflectionStub(ch)
            call = reflection.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(list_services="")])
            )
            names = [s.name async for r in call for s in r.list_services_response.service]
            assert SERVICE in names


async def test_the_blocking_client_of_the_cli_sends_the_token(tls_files: TlsFiles) -> None:
    """The `pml` command's channel, over TLS with a token (run in a thread: this test's event
    loop serves it)."""

    def get(address: str, settings: Settings) -> search_pb2.SearchResult:
        with blocking_channel(address, settings) as ch:
            stub = search_pb2_grpc.SearchServiceStub(ch)
            reply: search_pb2.SearchResult = stub.GetNode(
                search_pb2.GetNodeRequest(id="cli"), timeout=5
            )
            return reply

    server = server_tls(tls_files, auth_enabled=True, auth_token=SecretStr(TOKEN))
    async with serving(server) as address:
        with_token = client_tls(tls_files, auth_token=SecretStr(TOKEN))
        assert (await asyncio.to_thread(get, address, with_token)).id == "cli"
        with pytest.raises(grpc.RpcError) as err:
            await asyncio.to_thread(get, address, client_tls(tls_files))
        assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED  # type: ignore[attr-defined]


async def test_tokens_never_reach_the_logs() -> None:
    with structlog.testing.capture_logs() as logs:
        async with serving(auth_server()) as address:
            await refused(address, base_settings(auth_token=SecretStr(OTHER_TOKEN)))
            await refused(address, base_settings())
            await get_node(address, base_settings(auth_token=SecretStr(TOKEN)))
    reasons = [e.get("reason") for e in logs if e["event"] == "grpc.unauthenticated"]
    assert reasons == ["unknown token", "no bearer token"]
    assert TOKEN not in repr(logs)
    assert OTHER_TOKEN not in repr(logs)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (lambda: base_settings(auth_enabled=True), "needs at least one accepted token"),
        (
            lambda: base_settings(auth_enabled=True, auth_token=SecretStr("short")),
            "too short in: auth_token",
        ),
        (
            lambda: auth_server(auth_tokens=SecretStr(f"{OTHER_TOKEN},tiny")),
            "too short in: auth_tokens",
        ),
    ],
)
def test_auth_without_a_usable_token_stops_the_server(
    settings: Callable[[], Settings], message: str
) -> None:
    with pytest.raises(SecurityConfigError, match=message) as err:
        GrpcServer(settings(), 0, "x")
    assert "tiny" not in str(err.value)


def test_bearer_token_parsing() -> None:
    assert bearer_token_of([("authorization", f"Bearer {TOKEN}")]) == TOKEN
    assert bearer_token_of([("x-other", "1"), ("Authorization", f"bearer  {TOKEN} ")]) == TOKEN
    assert bearer_token_of([("authorization", f"Basic {TOKEN}")]) is None
    assert bearer_token_of([("authorization", "Bearer ")]) is None
    assert bearer_token_of([]) is None
    assert bearer_token_of(None) is None


def test_token_matching_compares_against_every_accepted_digest() -> None:
    import hashlib

    accepted = [hashlib.sha256(t.encode()).digest() for t in (TOKEN, OTHER_TOKEN)]
    assert token_matches(TOKEN, accepted)
    assert token_matches(OTHER_TOKEN, accepted)
    assert not token_matches(TOKEN[:-1], accepted)
    assert not token_matches(TOKEN + "x", accepted)
    assert not token_matches("", accepted)
