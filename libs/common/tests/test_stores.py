from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

import neo4j
import pytest
from neo4j.exceptions import ServiceUnavailable
from pydantic import SecretStr
from qdrant_client import models
from redis.exceptions import ConnectionError as RedisConnectionError

from pml_common.local_runtime import restart, start_neo4j, start_redis
from pml_common.settings import Settings
from pml_common.stores import (
    create_schema_rule,
    neo4j_auth,
    neo4j_driver,
    qdrant_client,
    redis_client,
)

# Without a server the calls below must fail within this many seconds (no hang).
FAIL_FAST_S = 10.0


async def test_redis_client_talks_bytes(settings: Settings, tenant: str) -> None:
    client = redis_client(settings)
    try:
        assert await client.ping() is True
        await client.set(f"{tenant}:k", b"\x00\xffbinary")
        assert await client.get(f"{tenant}:k") == b"\x00\xffbinary"
        kwargs = client.connection_pool.connection_kwargs
        assert kwargs["health_check_interval"] > 0
        assert kwargs["socket_connect_timeout"] <= 5
    finally:
        await client.aclose()


async def test_neo4j_driver_runs_queries(settings: Settings) -> None:
    driver = neo4j_driver(settings)
    try:
        records, _, _ = await driver.execute_query(
            "RETURN $x + 1 AS y", x=41, database_=settings.neo4j_database
        )
        assert records[0]["y"] == 42
    finally:
        await driver.close()


async def test_processes_starting_together_all_ensure_the_schema(settings: Settings) -> None:
    """Replicas creating the same rule at once: the ones that lose the race are told it exists
    already, and none of them fails; any other schema error still does."""
    index = "pml_test_race_index"
    statement = f"CREATE INDEX {index} IF NOT EXISTS FOR (n:RaceProbe) ON (n.key)"
    db = settings.neo4j_database
    driver = neo4j_driver(settings)
    try:
        await driver.execute_query(f"DROP INDEX {index} IF EXISTS", database_=db)
        await asyncio.gather(*(create_schema_rule(driver, statement, db) for _ in range(6)))
        records, _, _ = await driver.execute_query(
            "SHOW INDEXES YIELD name WHERE name = $name RETURN count(*) AS n",
            name=index,
            database_=db,
        )
        assert records[0]["n"] == 1
        with pytest.raises(neo4j.exceptions.ClientError):
            await create_schema_rule(driver, "CREATE INDEX FOR (n:RaceProbe) ON", db)
    finally:
        await driver.execute_query(f"DROP INDEX {index} IF EXISTS", database_=db)
        await driver.close()


async def test_neo4j_driver_keeps_unknown_property_warnings_out_of_the_logs(
    settings: Settings, caplog: pytest.LogCaptureFixture
) -> None:
    query = "MATCH (n:NeverWrittenLabel) RETURN n.never_written_property AS p"
    caplog.set_level(logging.INFO, logger="neo4j")
    plain = neo4j.AsyncGraphDatabase.driver(settings.neo4j_uri, auth=neo4j_auth(settings))
    try:  # the check can fail: a driver without the setting does log them
        await plain.execute_query(query, database_=settings.neo4j_database)
    finally:
        await plain.close()
    assert "never_written_property" in caplog.text
    caplog.clear()
    driver = neo4j_driver(settings)
    try:
        await driver.execute_query(query, database_=settings.neo4j_database)
    finally:
        await driver.close()
    assert "never_written_property" not in caplog.text


def test_neo4j_auth_only_when_password_set(settings: Settings) -> None:
    assert neo4j_auth(settings) is None
    with_password = settings.model_copy(
        update={"neo4j_user": "pml", "neo4j_password": SecretStr("pw")}
    )
    assert neo4j_auth(with_password) == ("pml", "pw")


async def test_qdrant_client_embedded_when_no_url(settings: Settings) -> None:
    client = qdrant_client(settings)
    try:
        assert client.init_options["path"] == settings.qdrant_path
        await client.create_collection(
            "probe", vectors_config=models.VectorParams(size=4, distance=models.Distance.COSINE)
        )
        assert await client.collection_exists("probe")
    finally:
        await client.close()
    assert (Path(settings.qdrant_path) / "collection" / "probe").is_dir()


async def test_qdrant_client_targets_server_when_url_set(settings: Settings) -> None:
    remote = settings.model_copy(
        update={"qdrant_url": "https://127.0.0.1:6333", "qdrant_api_key": SecretStr("k")}
    )
    client = qdrant_client(remote)
    try:
        assert client.init_options["url"] == "https://127.0.0.1:6333"
        assert client.init_options["api_key"] == "k"
        assert client.init_options["path"] is None
    finally:
        await client.close()


async def test_redis_fails_fast_when_down_and_recovers(tmp_path: Path) -> None:
    server = start_redis(tmp_path / "redis")
    settings = Settings(redis_url=server.url)
    client = redis_client(settings)
    try:
        await client.set("k", b"v1")
        server.kill()

        started = time.monotonic()
        with pytest.raises(RedisConnectionError):
            await client.get("k")
        elapsed = time.monotonic() - started
        print(f"redis down: failed in {elapsed:.2f}s")
        assert elapsed < FAIL_FAST_S

        server = restart(server)
        # Same client object, no rebuild: the pool reconnects by itself.
        await client.set("k", b"v2")
        assert await client.get("k") == b"v2"
    finally:
        await client.aclose()
        server.stop()


async def test_neo4j_fails_fast_when_down_and_recovers(tmp_path: Path) -> None:
    server = start_neo4j(tmp_path / "neo4j", heap_mb=512, page_cache_mb=64)
    settings = Settings(neo4j_uri=server.url)
    driver = neo4j_driver(settings)
    db = settings.neo4j_database
    try:
        await driver.execute_query("CREATE (:Probe {v: 1})", database_=db)
        server.kill()

        started = time.monotonic()
        with pytest.raises(ServiceUnavailable):
            await driver.execute_query("MATCH (p:Probe) RETURN p.v AS v", database_=db)
        elapsed = time.monotonic() - started
        print(f"neo4j down (managed tx): failed in {elapsed:.2f}s")
        assert elapsed < FAIL_FAST_S

        started = time.monotonic()
        with pytest.raises(ServiceUnavailable):
            async with driver.session(database=db) as session:
                await session.run("RETURN 1")
        elapsed = time.monotonic() - started
        print(f"neo4j down (auto-commit): failed in {elapsed:.2f}s")
        assert elapsed < FAIL_FAST_S

        server = restart(server)
        records, _, _ = await driver.execute_query(
            "MATCH (p:Probe) RETURN p.v AS v", database_=db, routing_=neo4j.RoutingControl.READ
        )
        assert [r["v"] for r in records] == [1]
    finally:
        await driver.close()
        server.stop()
