"""Pytest plugin: the real Redis and Neo4j servers the suite runs against, started once.

Enabled for the whole repository by the root `conftest.py`. Every test gets `settings` that
point at these servers and at a fresh embedded vector store folder; `clean_stores` empties
Redis and Neo4j for tests that need a blank slate.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from redis.asyncio import Redis

from pml_common.local_runtime import ManagedProcess, start_neo4j, start_redis
from pml_common.settings import Settings
from pml_common.stores import redis_client


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
