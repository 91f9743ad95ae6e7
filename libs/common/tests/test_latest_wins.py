from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta

from redis.asyncio import Redis

from pml_common.latest_wins import LatestWins

T0 = datetime(2026, 11, 21, 12, 0, tzinfo=UTC)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


async def test_a_request_older_than_the_latest_claim_is_refused(redis: Redis, tenant: str) -> None:
    claims = LatestWins(redis, "test")
    # deletion (t=2) handled before the submission it follows (t=1): the submission is stale
    assert await claims.claim_document(tenant, "doc", at(2))
    assert not await claims.claim_document(tenant, "doc", at(1))
    # a redelivery of the deletion is granted again, a later submission too
    assert await claims.claim_document(tenant, "doc", at(2))
    assert await claims.claim_document(tenant, "doc", at(3))
    assert not await claims.claim_document(tenant, "doc", at(2))
    # other documents are unaffected
    assert await claims.claim_document(tenant, "other", at(0))


async def test_a_tenant_deletion_refuses_the_requests_made_before_it(
    redis: Redis, tenant: str
) -> None:
    claims = LatestWins(redis, "test")
    assert await claims.claim_tenant_deletion(tenant, at(10))
    assert not await claims.claim_document(tenant, "doc", at(9))
    assert await claims.claim_document(tenant, "doc", at(11))
    assert not await claims.claim_tenant_deletion(tenant, at(5))
    assert await claims.claim_document(f"{tenant}-b", "doc", at(9))  # another tenant


async def test_scopes_and_ids_holding_colons_stay_apart(redis: Redis, tenant: str) -> None:
    ingest, search = LatestWins(redis, "ingest"), LatestWins(redis, "search")
    assert await ingest.claim_document(tenant, "doc", at(5))
    assert await search.claim_document(tenant, "doc", at(1))
    assert await ingest.claim_document(f"{tenant}:a", "b", at(5))
    assert await ingest.claim_document(tenant, "a:b", at(1))


async def test_concurrent_claims_leave_the_latest(redis: Redis, tenant: str) -> None:
    claims = LatestWins(redis, "test")
    await asyncio.gather(*(claims.claim_document(tenant, "doc", at(s)) for s in range(20)))
    assert not await claims.claim_document(tenant, "doc", at(18.5))
    assert await claims.claim_document(tenant, "doc", at(19))
