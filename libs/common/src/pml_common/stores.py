"""Clients of the stores (Redis, Neo4j, Qdrant), built from `Settings`.

Every service builds its clients here so that timeouts and retries are the same everywhere:
an unavailable store makes a call fail within seconds with the driver's own "unavailable"
error (which the gRPC layer maps to UNAVAILABLE) instead of hanging a request, and the same
client works again as soon as the store is back, without being rebuilt.
"""

from __future__ import annotations

from pathlib import Path

import neo4j
import redis.asyncio
from neo4j import NotificationDisabledClassification
from qdrant_client import AsyncQdrantClient
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialWithJitterBackoff
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from pml_common.neo4j_tracing import instrument_neo4j
from pml_common.settings import Settings, redis_credentials

# Redis: a dropped connection (server restart, idle timeout by a proxy) is retried a few times
# with a short backoff, which reconnects transparently; a server that stays down fails the call
# after roughly a second instead of the library default's ~10 s of backoff.
REDIS_RETRIES = 3
REDIS_BACKOFF_BASE_S = 0.05
REDIS_BACKOFF_CAP_S = 0.5
REDIS_CONNECT_TIMEOUT_S = 2.0
REDIS_HEALTH_CHECK_INTERVAL_S = 15

# Neo4j: `connection_timeout` bounds one TCP/Bolt connect; the acquisition timeout bounds the
# wait for a pooled connection (must be larger than the connect timeout); the retry time bounds
# how long managed transactions (`execute_query`, `execute_read/write`) retry transient errors,
# including "service unavailable", before giving up (driver default: 30 s).
NEO4J_CONNECT_TIMEOUT_S = 2.0
NEO4J_ACQUISITION_TIMEOUT_S = 5.0
NEO4J_MAX_RETRY_TIME_S = 5.0
# Pooled connections idle longer than this are checked before use, so a restarted server's
# dead sockets are replaced rather than failing the first query after the restart.
NEO4J_LIVENESS_CHECK_S = 2.0

QDRANT_TIMEOUT_S = 10

_SCHEMA_RULE_EXISTS = "Neo.ClientError.Schema.EquivalentSchemaRuleAlreadyExists"


def redis_client(settings: Settings, *, socket_timeout: float | None = 5.0) -> redis.asyncio.Redis:
    """Async Redis client returning bytes.

    `socket_timeout` bounds each reply; callers issuing blocking commands (XREADGROUP BLOCK,
    BLPOP) pass a value above their block time, or None.
    """
    retry = Retry(
        ExponentialWithJitterBackoff(base=REDIS_BACKOFF_BASE_S, cap=REDIS_BACKOFF_CAP_S),
        REDIS_RETRIES,
    )
    return redis.asyncio.Redis.from_url(
        settings.redis_url,
        decode_responses=False,
        health_check_interval=REDIS_HEALTH_CHECK_INTERVAL_S,
        socket_connect_timeout=REDIS_CONNECT_TIMEOUT_S,
        socket_timeout=socket_timeout,
        socket_keepalive=True,
        retry=retry,
        retry_on_error=[RedisConnectionError, RedisTimeoutError, ConnectionError, OSError],
        **redis_credentials(settings),
    )


def neo4j_auth(settings: Settings) -> tuple[str, str] | None:
    """Basic auth from settings; None when the password is empty (auth disabled server)."""
    password = settings.neo4j_password.get_secret_value()
    return (settings.neo4j_user, password) if password else None


def neo4j_driver(settings: Settings) -> neo4j.AsyncDriver:
    """Async Neo4j driver that fails fast when the server is unavailable.

    Queries should pass `database_=settings.neo4j_database` (the driver has no default). Every
    query it sends is traced (`neo4j_tracing`).
    """
    instrument_neo4j(settings.neo4j_database)
    return neo4j.AsyncGraphDatabase.driver(
        settings.neo4j_uri,
        auth=neo4j_auth(settings),
        connection_timeout=NEO4J_CONNECT_TIMEOUT_S,
        connection_acquisition_timeout=NEO4J_ACQUISITION_TIMEOUT_S,
        max_transaction_retry_time=NEO4J_MAX_RETRY_TIME_S,
        liveness_check_timeout=NEO4J_LIVENESS_CHECK_S,
        keep_alive=True,
        # "Property/label does not exist" on a store that has no such data yet: every query is
        # a constant the suite runs, so these only fill the logs of a fresh database.
        # Deprecation, performance and other notifications are still logged.
        notifications_disabled_classifications=[NotificationDisabledClassification.UNRECOGNIZED],
    )


async def create_schema_rule(driver: neo4j.AsyncDriver, statement: str, database: str) -> None:
    """Run one `CREATE ... IF NOT EXISTS` schema statement, safe for replicas starting together.

    Two processes creating the same rule at once race inside `IF NOT EXISTS`: the one that
    loses is told the rule exists, which is the outcome it wanted.
    """
    try:
        await driver.execute_query(statement, database_=database)
    except neo4j.exceptions.ClientError as exc:
        if exc.code != _SCHEMA_RULE_EXISTS:
            raise


def qdrant_client(settings: Settings) -> AsyncQdrantClient:
    """Qdrant server client when `qdrant_url` is set, else the embedded store at `qdrant_path`.

    The embedded store locks its folder: only one process (the search service) may open it.
    """
    if settings.qdrant_url:
        key = settings.qdrant_api_key
        return AsyncQdrantClient(
            url=settings.qdrant_url,
            api_key=key.get_secret_value() if key else None,
            timeout=QDRANT_TIMEOUT_S,
            # The deployments pin the server version; the check would only add a network call
            # (and a warning when the server starts after us) to every client construction.
            check_compatibility=False,
        )
    path = Path(settings.qdrant_path)
    path.mkdir(parents=True, exist_ok=True)
    return AsyncQdrantClient(path=str(path))
