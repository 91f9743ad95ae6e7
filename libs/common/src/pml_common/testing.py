"""Pytest plugin: the real Redis and Neo4j servers the suite runs against, started once.

Enabled for the whole repository by the root `conftest.py`. Every test gets `settings` that
point at these servers and at a fresh embedded vector store folder; `clean_stores` empties
Redis and Neo4j for tests that need a blank slate.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import neo4j
import pytest
from redis.asyncio import Redis

from pml_common.healthcheck import check
from pml_common.local_runtime import ManagedProcess, free_port, start_neo4j, start_redis
from pml_common.settings import Settings
from pml_common.stores import neo4j_driver, redis_client

T = TypeVar("T")


@pytest.fixture(scope="session")
def runtime_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("pml-runtime")


@pytest.fixture(scope="session")
def redis_server(runtime_dir: Path) -> Iterator[ManagedProcess]:
    proc = start_redis(runtime_dir / "redis")
    yield proc
    proc.stop()


@pytest.fixture(scope="session")
def neo4j_server(runtime_dir: Path) -> Iterator[ManagedProcess]:
    proc = start_neo4j(runtime_dir / "neo4j", heap_mb=768, page_cache_mb=128)
    yield proc
    proc.stop()


@pytest.fixture
def settings(
    redis_server: ManagedProcess, neo4j_server: ManagedProcess, tmp_path: Path
) -> Settings:
    """Settings for the test's own processes: real servers, a private vector store folder."""
    return Settings(
        redis_url=redis_server.url,
        neo4j_uri=neo4j_server.url,
        qdrant_path=str(tmp_path / "qdrant"),
        consumer_name=f"test-{uuid.uuid4().hex[:8]}",
        log_format="console",
        reclaim_idle_ms=1000,
    )


@pytest.fixture
def settings_env(settings: Settings) -> dict[str, str]:
    """The same settings as environment variables, for child processes."""
    env = dict(os.environ)
    for name, value in settings.model_dump().items():
        if value is None:
            continue
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        env[f"PML_{name.upper()}"] = str(value)
    return env


@pytest.fixture
async def redis(settings: Settings) -> AsyncIterator[Redis]:
    """An async client of the suite's Redis (bytes replies), closed after the test."""
    client = redis_client(settings)
    try:
        yield client
    finally:
        await client.aclose()


@pytest.fixture
async def graph_db(settings: Settings) -> AsyncIterator[neo4j.AsyncDriver]:
    """A driver of the suite's Neo4j, for tests that write or read the graph directly."""
    driver = neo4j_driver(settings)
    try:
        yield driver
    finally:
        await driver.close()


@pytest.fixture
def tenant() -> str:
    """A tenant of its own for each test, so tests sharing servers never see each other."""
    return f"t-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def clean_stores(settings: Settings) -> Iterator[None]:
    import redis
    from neo4j import GraphDatabase

    def wipe() -> None:
        redis.Redis.from_url(settings.redis_url).flushall()
        with GraphDatabase.driver(settings.neo4j_uri, auth=None) as driver:
            driver.execute_query("MATCH (n) DETACH DELETE n")

    wipe()
    yield


def until(condition: Callable[[], bool], within_s: float, what: str) -> float:
    """Poll `condition()` until it holds; returns the monotonic time it first did (drills time
    their recoveries with it), or fails naming `what` after `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not reached within {within_s}s")
        time.sleep(0.05)
    return time.monotonic()


async def eventually(
    probe: Callable[[], Awaitable[T]], done: Callable[[T], bool], within_s: float = 20.0
) -> T:
    """Poll `probe` until `done(value)`; fail with the last value after `within_s` seconds."""
    deadline = time.monotonic() + within_s
    while True:
        value = await probe()
        if done(value):
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"condition not met within {within_s}s; last value: {value!r}")
        await asyncio.sleep(0.05)


@dataclass(frozen=True)
class ServiceProcess:
    proc: subprocess.Popen[bytes]
    address: str
    log: Path

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]


@contextlib.contextmanager
def service_process(
    module: str,
    port_variable: str,
    env: Mapping[str, str],
    log: Path,
    within_s: float = 120.0,
    settings: Settings | None = None,
    graceful: bool = False,
) -> Iterator[ServiceProcess]:
    """`python -m module` on a free port, yielded once its gRPC health answers SERVING (asked
    over TLS when `settings` enable it, as `env` should then do for the process).

    The test decides how the process ends (to check a graceful stop, say); one still running
    when the block exits is killed, or with `graceful` sent SIGTERM (as an orchestrator stops
    it, releasing what it holds) and killed if it is still there after 30 s.
    """
    port = free_port()
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", module],
            env={**env, port_variable: str(port)},
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    running = ServiceProcess(proc, f"127.0.0.1:{port}", log)
    try:
        deadline = time.monotonic() + within_s
        while not check(running.address, timeout=1.0, settings=settings):
            assert proc.poll() is None, f"{module} exited:\n{running.log_tail()}"
            assert time.monotonic() < deadline, f"{module} never became SERVING"
            time.sleep(0.2)
        yield running
    finally:
        try:
            if proc.poll() is None and graceful:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)  # a process that ignores SIGTERM fails the test, once killed
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of a throwaway PKI: a CA; a service certificate it signed for both ends of
    mutual TLS (server and client usages, as each service presents one certificate to its
    clients and to the services it calls); a client-only and a server-only certificate; and a
    certificate of another CA, which PML must refuse."""

    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    server_only_cert: Path
    server_only_key: Path
    other_ca: Path
    other_cert: Path
    other_key: Path


def make_tls_files(folder: Path, hosts: Sequence[str] = ("localhost", "127.0.0.1")) -> TlsFiles:
    """Write a throwaway CA and certificates into `folder`; the server's names `hosts`.

    Needs the `cryptography` package (a development dependency).
    """
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    folder.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)

    def name(common_name: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

    def write(stem: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Path:
        (folder / f"{stem}.key").write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        path = folder / f"{stem}.pem"
        path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
        return path

    def authority(common_name: str) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (
            x509.CertificateBuilder()
            .subject_name(name(common_name))
            .issuer_name(name(common_name))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(key, hashes.SHA256())
        )
        return cert, key

    def leaf(
        common_name: str,
        issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey],
        usages: list[x509.ObjectIdentifier],
    ) -> tuple[x509.Certificate, ec.EllipticCurvePrivateKey]:
        key = ec.generate_private_key(ec.SECP256R1())
        names: list[x509.GeneralName] = []
        for host in hosts:
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        cert = (
            x509.CertificateBuilder()
            .subject_name(name(common_name))
            .issuer_name(issuer[0].subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .sign(issuer[1], hashes.SHA256())
        )
        return cert, key

    ca = authority("pml test CA")
    other = authority("some other CA")
    server_auth, client_auth = ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH
    server = leaf("pml service", ca, [server_auth, client_auth])
    client = leaf("pml client", ca, [client_auth])
    server_only = leaf("server only", ca, [server_auth])
    stranger = leaf("stranger", other, [client_auth])
    return TlsFiles(
        ca=write("ca", *ca),
        server_cert=write("server", *server),
        server_key=folder / "server.key",
        client_cert=write("client", *client),
        client_key=folder / "client.key",
        server_only_cert=write("server-only", *server_only),
        server_only_key=folder / "server-only.key",
        other_ca=write("other-ca", *other),
        other_cert=write("stranger", *stranger),
        other_key=folder / "stranger.key",
    )


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> TlsFiles:
    """One throwaway PKI for the session (see `make_tls_files`)."""
    return make_tls_files(tmp_path_factory.mktemp("tls"))
