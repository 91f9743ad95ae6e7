"""Versioned model storage per tenant in Redis, guarded by the trainer's fencing token.

The trainer that holds the lease lock publishes a model version; the scorer reads the current
one. A publish is accepted only when its fencing token is the newest one issued
(`FENCING_COUNTER_KEY`) and not older than the token of the tenant's current model, checked in
the same Lua script that stores the model. So a trainer that lost its lease (and was replaced
by one that acquired a newer token) can never overwrite or append to the registry, even if it
does not know yet that it lost the lease.

Keys of a tenant, all fixed so that the publish script declares every key it touches:

- `pml:model:{tenant}:seq`       version counter (INCR; version `v{seq}`)
- `pml:model:{tenant}:current`   hash {version, fencing_token} of the current model
- `pml:model:{tenant}:versions`  sorted set version -> seq (oldest are trimmed)
- `pml:model:{tenant}:records`   hash version -> record JSON (without the version)
- `pml:model:{tenant}:blobs`     hash version -> model bytes
- `pml:model:{tenant}:rejected`  hash {version, record, blob} of the last rejected candidate

A trained candidate that the trainer's gate does not admit (it ranks held-back executions no
better than the serving version or the first stage) is kept as the tenant's last rejected
candidate with its figures (`reject`): it takes a version number, under the same fencing rule,
but never becomes current.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import redis.asyncio as aioredis
import structlog
from pydantic import BaseModel, ConfigDict, Field

from pml_common import redis_keys
from pml_common.lease_lock import FENCING_COUNTER_KEY

log = structlog.get_logger("pml_common.model_registry")

# KEYS: fencing counter, seq, current, versions, records, blobs
# ARGV: fencing token, record JSON (without version), blob, keep_versions
# Returns {1, version} when published, {0, newest issued token, current model token} when stale.
_PUBLISH = """
local token = tonumber(ARGV[1])
local issued = tonumber(redis.call('GET', KEYS[1]) or '0')
local current_token = tonumber(redis.call('HGET', KEYS[3], 'fencing_token') or '-1')
if token ~= issued or token < current_token then
  return {0, issued, current_token}
end
local seq = redis.call('INCR', KEYS[2])
local version = 'v' .. seq
redis.call('HSET', KEYS[5], version, ARGV[2])
redis.call('HSET', KEYS[6], version, ARGV[3])
redis.call('ZADD', KEYS[4], seq, version)
redis.call('HSET', KEYS[3], 'version', version, 'fencing_token', ARGV[1])
local excess = redis.call('ZCARD', KEYS[4]) - tonumber(ARGV[4])
if excess > 0 then
  local old = redis.call('ZRANGE', KEYS[4], 0, excess - 1)
  redis.call('HDEL', KEYS[5], unpack(old))
  redis.call('HDEL', KEYS[6], unpack(old))
  redis.call('ZREM', KEYS[4], unpack(old))
end
return {1, version}
"""

# KEYS: current, records, blobs; ARGV: '1' to include the blob.
# The current pointer and its version's data are read together, so a concurrent publish that
# trims that version cannot leave the reader with a pointer to nothing.
_CURRENT = """
local version = redis.call('HGET', KEYS[1], 'version')
if not version then
  return false
end
local record = redis.call('HGET', KEYS[2], version)
if ARGV[1] == '1' then
  return {version, record, redis.call('HGET', KEYS[3], version)}
end
return {version, record}
"""


# KEYS: fencing counter, seq, current, rejected; ARGV: fencing token, record JSON, blob.
# Returns {1, version} when kept, {0, newest issued token, current model token} when stale.
_REJECT = """
local token = tonumber(ARGV[1])
local issued = tonumber(redis.call('GET', KEYS[1]) or '0')
local current_token = tonumber(redis.call('HGET', KEYS[3], 'fencing_token') or '-1')
if token ~= issued or token < current_token then
  return {0, issued, current_token}
end
local version = 'v' .. redis.call('INCR', KEYS[2])
redis.call('DEL', KEYS[4])
redis.call('HSET', KEYS[4], 'version', version, 'record', ARGV[2], 'blob', ARGV[3])
return {1, version}
"""


class StaleFencingToken(Exception):
    """A publish carried a fencing token that is no longer the newest: its lease was lost."""

    def __init__(self, tenant_id: str, token: int, issued: int, current_token: int | None) -> None:
        self.tenant_id = tenant_id
        self.token = token
        self.issued = issued
        self.current_token = current_token
        current = "none" if current_token is None else str(current_token)
        super().__init__(
            f"model for tenant {tenant_id!r} not published: fencing token {token} is stale "
            f"(newest token issued: {issued}; current model's token: {current}); "
            "the lease that issued it was lost to another trainer"
        )


class ModelRecord(BaseModel):
    """Metadata of one published model version."""

    model_config = ConfigDict(frozen=True)

    tenant_id: str = Field(min_length=1)
    version: str = Field(min_length=1)
    fencing_token: int = Field(ge=0)
    trained_at: datetime
    metrics: dict[str, float] = Field(default_factory=dict)


class ModelRegistry:
    """Publishes and reads model versions; see the module docstring."""

    def __init__(
        self,
        redis: aioredis.Redis,
        keep_versions: int = 5,
        *,
        fencing_key: str = FENCING_COUNTER_KEY,
    ) -> None:
        if keep_versions < 1:
            raise ValueError("keep_versions must be at least 1")
        self._redis = redis
        self.keep_versions = keep_versions
        self.fencing_key = fencing_key
        self._publish = redis.register_script(_PUBLISH)
        self._current = redis.register_script(_CURRENT)
        self._reject = redis.register_script(_REJECT)

    async def publish(
        self,
        tenant_id: str,
        blob: bytes,
        fencing_token: int,
        metrics: dict[str, float] | None = None,
        *,
        trained_at: datetime | None = None,
    ) -> ModelRecord:
        """Store `blob` as the tenant's next version and make it current.

        Raises `StaleFencingToken` (and changes nothing) unless `fencing_token` is the newest
        issued and not older than the current model's.
        """
        draft = ModelRecord(
            tenant_id=tenant_id,
            version="pending",
            fencing_token=fencing_token,
            trained_at=trained_at or datetime.now(UTC),
            metrics=metrics or {},
        )
        k = _Keys(tenant_id)
        reply = await self._publish(
            keys=[self.fencing_key, k.seq, k.current, k.versions, k.records, k.blobs],
            args=[fencing_token, _dump(draft), blob, self.keep_versions],
        )
        _check_reply(tenant_id, fencing_token, reply)
        record = draft.model_copy(update={"version": _text(reply[1])})
        log.info(
            "model.published",
            tenant_id=tenant_id,
            version=record.version,
            fencing_token=fencing_token,
            bytes=len(blob),
        )
        return record

    async def reject(
        self,
        tenant_id: str,
        blob: bytes,
        fencing_token: int,
        metrics: dict[str, float] | None = None,
    ) -> ModelRecord:
        """Keep `blob` as the tenant's last rejected candidate (never served), with a version.

        Raises `StaleFencingToken` under the same rule as `publish`.
        """
        draft = ModelRecord(
            tenant_id=tenant_id,
            version="pending",
            fencing_token=fencing_token,
            trained_at=datetime.now(UTC),
            metrics=metrics or {},
        )
        k = _Keys(tenant_id)
        reply = await self._reject(
            keys=[self.fencing_key, k.seq, k.current, k.rejected],
            args=[fencing_token, _dump(draft), blob],
        )
        _check_reply(tenant_id, fencing_token, reply)
        record = draft.model_copy(update={"version": _text(reply[1])})
        log.info("model.candidate_rejected", tenant_id=tenant_id, version=record.version)
        return record

    async def last_rejected(self, tenant_id: str) -> tuple[ModelRecord, bytes] | None:
        """The last candidate the gate rejected, and its bytes; None if there was none."""
        rows: list[bytes | None] = await self._redis.hmget(  # type: ignore[assignment]
            _Keys(tenant_id).rejected, ["version", "record", "blob"]
        )
        version, raw, blob = rows
        if version is None or raw is None or blob is None:
            return None
        return _load(tenant_id, _text(version), raw), bytes(blob)

    async def current(self, tenant_id: str) -> tuple[ModelRecord, bytes] | None:
        """The tenant's current model and its bytes, or None before the first publish."""
        k = _Keys(tenant_id)
        reply = await self._current(keys=[k.current, k.records, k.blobs], args=["1"])
        if not reply:
            return None
        version, raw, blob = reply
        return _load(tenant_id, _text(version), raw), bytes(blob)

    async def current_record(self, tenant_id: str) -> ModelRecord | None:
        """The current model's metadata without its bytes (cheap: to check for a new version)."""
        k = _Keys(tenant_id)
        reply = await self._current(keys=[k.current, k.records, k.blobs], args=["0"])
        if not reply:
            return None
        version, raw = reply
        return _load(tenant_id, _text(version), raw)

    async def get(self, tenant_id: str, version: str) -> tuple[ModelRecord, bytes] | None:
        """One kept version, or None when it never existed or was trimmed."""
        k = _Keys(tenant_id)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hget(k.records, version)
            pipe.hget(k.blobs, version)
            raw, blob = await pipe.execute()
        if raw is None or blob is None:
            return None
        return _load(tenant_id, version, raw), bytes(blob)

    async def versions(self, tenant_id: str) -> list[str]:
        """Kept versions, oldest first."""
        rows: list[bytes] = await self._redis.zrange(_Keys(tenant_id).versions, 0, -1)  # type: ignore[assignment]
        return [_text(v) for v in rows]

    async def delete_tenant(self, tenant_id: str) -> None:
        """Forget every version of the tenant (and its version counter)."""
        k = _Keys(tenant_id)
        await self._redis.delete(k.seq, k.current, k.versions, k.records, k.blobs, k.rejected)
        log.info("model.tenant_deleted", tenant_id=tenant_id)


class _Keys:
    def __init__(self, tenant_id: str) -> None:
        if not tenant_id:
            raise ValueError("tenant_id must not be empty")
        self.seq = redis_keys.model(tenant_id, "seq")
        self.current = redis_keys.model(tenant_id, "current")
        self.versions = redis_keys.model(tenant_id, "versions")
        self.records = redis_keys.model(tenant_id, "records")
        self.blobs = redis_keys.model(tenant_id, "blobs")
        self.rejected = redis_keys.model(tenant_id, "rejected")


def _check_reply(tenant_id: str, fencing_token: int, reply: list[bytes | int]) -> None:
    """Raise `StaleFencingToken` for a script's {0, issued, current token} answer."""
    if int(reply[0]) == 1:
        return
    current_token = int(reply[2])
    error = StaleFencingToken(
        tenant_id, fencing_token, int(reply[1]), current_token if current_token >= 0 else None
    )
    log.warning("model.publish_rejected", tenant_id=tenant_id, reason=str(error))
    raise error


def _dump(record: ModelRecord) -> str:
    # The version is the hash field the record is stored under, allocated inside the script.
    return record.model_dump_json(exclude={"version"})


def _load(tenant_id: str, version: str, raw: bytes) -> ModelRecord:
    data = json.loads(raw)
    data.update(tenant_id=tenant_id, version=version)
    return ModelRecord.model_validate(data)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
