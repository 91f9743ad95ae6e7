"""Pytest plugin: the real Redis and Neo4j servers the suite runs against, started once.

Enabled for the whole repository by the root `conftest.py`. Every test gets `settings` that
point at these servers and at a fresh embedded vector store folder; `clean_stores` empties
Redis and Neo4j for tests that need a blank slate.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping
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
    module: str, port_variable: str, env: Mapping[str, str], log: Path, within_s: float = 120.0
) -> Iterator[ServiceProcess]:
    """`python -m module` on a free port, yielded once its gRPC health answers SERVING.

    The test decides how the process ends (to check a graceful stop, say); one still running
    when the block exits is killed.
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
        while not check(running.address, timeout=1.0):
            assert proc.poll() is None, f"{module} exited:\n{running.log_tail()}"
            assert time.monotonic() < deadline, f"{module} never became SERVING"
            time.sleep(0.2)
        yield running
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
