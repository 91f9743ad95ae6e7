"""Per-document, per-pass ingestion status, kept in Redis by the ingest service and workers.

One hash per document (`redis_keys.ingest_status`, whose parts are escaped so that tenant `a:x`
with document `y` and tenant `a` with document `x:y` never share it), with `content_hash`,
`title` and, for each pass, `<pass>:state` (pending, running, done, failed), `<pass>:updated_at`
and `<pass>:error`; a set per tenant (`redis_keys.ingest_documents`) lists its documents. A pass
only records states for the content hash the document currently has, so a late event about an
older version never overwrites the status of the newer one.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from redis.asyncio import Redis

from pml_common import redis_keys
from pml_common.events import utcnow

PASSES = ("chunking", "pass1", "pass2a", "pass2b", "pass3")
PENDING, RUNNING, DONE, FAILED = "pending", "running", "done", "failed"

# Writes a pass state only if the document's content hash is the one the pass worked on.
_SET_IF_CURRENT = """
if redis.call('HGET', KEYS[1], 'content_hash') ~= ARGV[1] then return 0 end
redis.call('HSET', KEYS[1], ARGV[2] .. ':state', ARGV[3], ARGV[2] .. ':updated_at', ARGV[4],
           ARGV[2] .. ':error', ARGV[5])
return 1
"""


@dataclass(frozen=True)
class PassState:
    name: str
    state: str
    updated_at: str
    error: str


@dataclass(frozen=True)
class DocumentStatus:
    document_id: str
    content_hash: str
    title: str
    passes: tuple[PassState, ...]

    @property
    def done(self) -> bool:
        return all(p.state == DONE for p in self.passes)


def _key(tenant: str, doc: str) -> str:
    return redis_keys.ingest_status(tenant, doc)


def _index(tenant: str) -> str:
    return redis_keys.ingest_documents(tenant)


def _text(value: bytes | str | None) -> str:
    if value is None:
        return ""
    return value.decode() if isinstance(value, bytes) else value


class StatusStore:
    def __init__(self, redis: Redis) -> None:
        self._redis = redis
        self._set_if_current = redis.register_script(_SET_IF_CURRENT)

    async def submitted(self, tenant: str, doc: str, content_hash: str, title: str) -> None:
        """A new version is on its way: every pass pending."""
        at = utcnow().isoformat()
        fields: dict[str, str] = {"content_hash": content_hash, "title": title}
        for name in PASSES:
            fields.update({f"{name}:state": PENDING, f"{name}:updated_at": at, f"{name}:error": ""})
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(_key(tenant, doc), mapping=fields)  # type: ignore[arg-type]
            pipe.sadd(_index(tenant), doc)
            await pipe.execute()

    async def ensure_many(self, tenant: str, docs: Sequence[tuple[str, str, str]]) -> None:
        """Record the (document, content hash, title) a worker meets that Submit did not
        announce (an event published straight on the stream), so its passes are visible too;
        one read for all."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for doc, _, _ in docs:
                pipe.hget(_key(tenant, doc), "content_hash")
            current = await pipe.execute()
        for (doc, content_hash, title), known in zip(docs, current, strict=True):
            if _text(known) != content_hash:
                await self.submitted(tenant, doc, content_hash, title)

    async def mark(
        self, tenant: str, doc: str, content_hash: str, name: str, state: str, error: str = ""
    ) -> bool:
        """Set one pass's state for this content; False when the document moved on."""
        [result] = await self.mark_many(tenant, [(doc, content_hash)], name, state, error)
        return result

    async def mark_many(
        self,
        tenant: str,
        hashes: Sequence[tuple[str, str]],
        name: str,
        state: str,
        error: str = "",
    ) -> list[bool]:
        """`mark` for each (document, content hash), in one round trip."""
        at = utcnow().isoformat()
        async with self._redis.pipeline(transaction=False) as pipe:
            for doc, content_hash in hashes:
                await self._set_if_current(
                    keys=[_key(tenant, doc)],
                    args=[content_hash, name, state, at, error[:2000]],
                    client=pipe,
                )
            results = await pipe.execute()
        return [bool(r) for r in results]

    async def get(self, tenant: str, doc: str) -> DocumentStatus | None:
        [status] = await self.many(tenant, [doc])
        return status

    async def many(self, tenant: str, docs: Sequence[str]) -> list[DocumentStatus | None]:
        """Statuses of several documents in one round trip; None for an unknown one."""
        async with self._redis.pipeline(transaction=False) as pipe:
            for doc in docs:
                pipe.hgetall(_key(tenant, doc))
            rows = await pipe.execute()
        return [_status(doc, data) for doc, data in zip(docs, rows, strict=True)]

    async def documents(self, tenant: str) -> list[str]:
        members = await self._redis.smembers(_index(tenant))
        return sorted(_text(m) for m in members)

    async def forget(self, tenant: str, doc: str) -> None:
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.delete(_key(tenant, doc))
            pipe.srem(_index(tenant), doc)
            await pipe.execute()

    async def forget_tenant(self, tenant: str) -> int:
        """Forget every document of the tenant; returns how many there were."""
        docs = await self.documents(tenant)
        async with self._redis.pipeline(transaction=False) as pipe:
            for doc in docs:
                pipe.delete(_key(tenant, doc))
            pipe.delete(_index(tenant))
            await pipe.execute()
        return len(docs)


def _status(doc: str, data: dict[bytes, bytes]) -> DocumentStatus | None:
    if not data:
        return None
    fields = {_text(k): _text(v) for k, v in data.items()}
    passes = tuple(
        PassState(
            name,
            fields.get(f"{name}:state", PENDING),
            fields.get(f"{name}:updated_at", ""),
            fields.get(f"{name}:error", ""),
        )
        for name in PASSES
    )
    return DocumentStatus(doc, fields.get("content_hash", ""), fields.get("title", ""), passes)
