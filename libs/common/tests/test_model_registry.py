from __future__ import annotations

import asyncio

import pytest
import redis.asyncio as aioredis

from pml_common.lease_lock import FENCING_COUNTER_KEY, LeaseLock
from pml_common.model_registry import ModelRecord, ModelRegistry, StaleFencingToken

BLOB = bytes(range(256)) * 64 + b"\x00\xff\x00"


@pytest.fixture
def fencing_key(tenant: str) -> str:
    """A fencing counter of the test's own: the real one is shared by every test."""
    return f"pml:test:{tenant}:fencing"


@pytest.fixture
def registry(redis: aioredis.Redis, fencing_key: str) -> ModelRegistry:
    return ModelRegistry(redis, keep_versions=3, fencing_key=fencing_key)


def test_default_fencing_key_is_the_lock_counter() -> None:
    assert ModelRegistry(aioredis.Redis()).fencing_key == FENCING_COUNTER_KEY


async def test_publish_and_read_back(
    registry: ModelRegistry, redis: aioredis.Redis, fencing_key: str, tenant: str
) -> None:
    assert await registry.current(tenant) is None
    assert await registry.current_record(tenant) is None
    token = await redis.incr(fencing_key)

    record = await registry.publish(tenant, BLOB, token, {"loss": 0.1 + 0.2, "auc": 0.75})
    assert record.version == "v1"
    assert record.tenant_id == tenant
    assert record.fencing_token == token
    assert record.metrics == {"loss": 0.1 + 0.2, "auc": 0.75}
    assert record.trained_at.tzinfo is not None

    current = await registry.current(tenant)
    assert current is not None
    assert current == (record, BLOB)
    assert await registry.current_record(tenant) == record
    assert await registry.get(tenant, "v1") == (record, BLOB)
    assert await registry.get(tenant, "v2") is None
    assert await registry.versions(tenant) == ["v1"]

    second = await registry.publish(tenant, b"", token)  # same lease, next round
    assert second.version == "v2"
    assert await registry.current(tenant) == (second, b"")


async def test_stale_token_is_rejected_and_changes_nothing(
    registry: ModelRegistry, redis: aioredis.Redis, fencing_key: str, tenant: str
) -> None:
    old = await redis.incr(fencing_key)
    first = await registry.publish(tenant, BLOB, old, {"loss": 1.0})
    new = await redis.incr(fencing_key)  # another trainer acquired the lock

    with pytest.raises(StaleFencingToken) as rejected:
        await registry.publish(tenant, b"late", old, {"loss": 0.5})
    assert rejected.value.token == old
    assert rejected.value.issued == new
    assert rejected.value.current_token == old
    assert f"fencing token {old} is stale" in str(rejected.value)
    assert f"newest token issued: {new}" in str(rejected.value)

    assert await registry.current(tenant) == (first, BLOB)
    assert await registry.versions(tenant) == ["v1"]
    # The rejected publish did not take a version number either.
    assert (await registry.publish(tenant, b"next", new)).version == "v2"


async def test_token_older_than_the_current_model_is_rejected(
    registry: ModelRegistry, redis: aioredis.Redis, fencing_key: str, tenant: str
) -> None:
    await redis.set(fencing_key, 7)
    published = await registry.publish(tenant, BLOB, 7)
    await redis.set(fencing_key, 3)  # the counter went backwards (e.g. restored from a backup)

    with pytest.raises(StaleFencingToken) as rejected:
        await registry.publish(tenant, b"x", 3)
    assert rejected.value.current_token == 7
    assert await registry.current(tenant) == (published, BLOB)


async def test_token_never_issued_is_rejected(registry: ModelRegistry, tenant: str) -> None:
    with pytest.raises(StaleFencingToken) as rejected:
        await registry.publish(tenant, BLOB, 1)
    assert rejected.value.issued == 0
    assert rejected.value.current_token is None
    assert await registry.current(tenant) is None


async def test_old_versions_are_trimmed(
    registry: ModelRegistry, redis: aioredis.Redis, fencing_key: str, tenant: str
) -> None:
    token = await redis.incr(fencing_key)
    records = [await registry.publish(tenant, f"m{i}".encode(), token) for i in range(1, 6)]

    assert await registry.versions(tenant) == ["v3", "v4", "v5"]
    assert await registry.get(tenant, "v1") is None
    assert await registry.get(tenant, "v2") is None
    assert await registry.get(tenant, "v3") == (records[2], b"m3")
    assert await registry.current(tenant) == (records[4], b"m5")
    assert await redis.hlen(f"pml:model:{tenant}:blobs") == 3
    assert await redis.hlen(f"pml:model:{tenant}:records") == 3


async def test_concurrent_publishes_get_distinct_versions(
    registry: ModelRegistry, redis: aioredis.Redis, fencing_key: str, tenant: str
) -> None:
    token = await redis.incr(fencing_key)
    records = await asyncio.gather(
        *(registry.publish(tenant, f"m{i}".encode(), token) for i in range(10))
    )
    assert sorted(int(r.version[1:]) for r in records) == list(range(1, 11))
    assert await registry.versions(tenant) == ["v8", "v9", "v10"]
    current = await registry.current_record(tenant)
    assert current is not None and current.version == "v10"


async def test_tenants_are_isolated(
    registry: ModelRegistry, redis: aioredis.Redis, fencing_key: str, tenant: str
) -> None:
    other = f"{tenant}-other"
    token = await redis.incr(fencing_key)
    mine = await registry.publish(tenant, b"mine", token)
    await registry.publish(tenant, b"mine-2", token)
    theirs = await registry.publish(other, b"theirs", token)
    assert theirs.version == "v1"  # version numbers are per tenant

    await registry.delete_tenant(tenant)
    assert await registry.current(tenant) is None
    assert await registry.get(tenant, mine.version) is None
    assert await registry.versions(tenant) == []
    assert await redis.keys(f"pml:model:{tenant}:*") == []
    assert await registry.current(other) == (theirs, b"theirs")

    again = await registry.publish(tenant, b"fresh", token)
    assert again.version == "v1"


async def test_lease_lock_tokens_fence_the_registry(
    redis: aioredis.Redis, fencing_key: str, tenant: str
) -> None:
    """A trainer whose lease expired cannot publish once another one acquired the lock."""
    lock_name = f"pml:test:{tenant}:lock"
    registry = ModelRegistry(redis, fencing_key=fencing_key)
    a = LeaseLock(redis, lock_name, lease_ms=300, owner="a", fencing_key=fencing_key)
    b = LeaseLock(redis, lock_name, lease_ms=300, owner="b", fencing_key=fencing_key)

    lease_a = await a.try_acquire()
    assert lease_a is not None
    published = await registry.publish(tenant, b"from-a", lease_a.token, {"loss": 0.3})
    assert published.fencing_token == lease_a.token

    await asyncio.sleep(0.4)  # A stalls past its lease without renewing
    lease_b = await b.try_acquire()
    assert lease_b is not None and lease_b.token > lease_a.token

    with pytest.raises(StaleFencingToken):
        await registry.publish(tenant, b"late-from-a", lease_a.token)
    assert await registry.current(tenant) == (published, b"from-a")

    from_b = await registry.publish(tenant, b"from-b", lease_b.token)
    assert await registry.current(tenant) == (from_b, b"from-b")
    assert from_b.fencing_token == lease_b.token


def test_record_validates() -> None:
    with pytest.raises(ValueError):
        ModelRecord(
            tenant_id="t", version="v1", fencing_token=-1, trained_at="2026-01-01T00:00:00Z"
        )


async def test_a_rejected_candidate_is_kept_but_never_current(
    registry: ModelRegistry, redis: aioredis.Redis, fencing_key: str, tenant: str
) -> None:
    token = await redis.incr(fencing_key)
    served = await registry.publish(tenant, b"served", token, {"accepted": 1.0})
    first = await registry.reject(tenant, b"worse", token, {"accepted": 0.0, "recall": 0.2})
    second = await registry.reject(tenant, BLOB, token, {"accepted": 0.0, "recall": 0.3})
    # versions are numbered with the published ones; only the last rejection is kept
    assert (served.version, first.version, second.version) == ("v1", "v2", "v3")
    kept = await registry.last_rejected(tenant)
    assert kept is not None and kept[0].version == "v3" and kept[1] == BLOB
    assert kept[0].metrics == {"accepted": 0.0, "recall": 0.3}
    current = await registry.current(tenant)
    assert current is not None and current[0].version == "v1" and current[1] == b"served"
    assert await registry.versions(tenant) == ["v1"]
    # a lost lease cannot record a rejection either
    await redis.incr(fencing_key)
    with pytest.raises(StaleFencingToken):
        await registry.reject(tenant, b"late", token, {})
    assert (await registry.last_rejected(tenant))[0].version == "v3"  # type: ignore[index]
    await registry.delete_tenant(tenant)
    assert await registry.last_rejected(tenant) is None
