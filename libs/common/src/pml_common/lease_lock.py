"""A Redis lease lock with fencing tokens: the trainer lock of PML.

Several trainer replicas run; only the one holding the lock trains and publishes models. A lease
is a Redis key set with `SET NX PX`: it expires by itself when its holder dies, so a crashed
trainer blocks the others for at most one lease. The holder renews it every third of the lease
from a heartbeat task (`LeaseLock.hold`).

Expiry makes a lease unsafe on its own: a holder paused longer than its lease (GC, a stalled
VM, a network partition) wakes up believing it still holds the lock. Each acquisition therefore
takes a fencing token, a number that strictly increases across acquisitions (`INCR` on
`FENCING_COUNTER_KEY`, in the same Lua script as the `SET NX`, so a token is only ever issued
together with a lease). Stores that the holder writes (the model registry) reject writes whose
token is no longer the newest issued; that, not the lease, is what keeps a stale holder out.

The holder learns it lost the lease through `Lease.lost` (set by the heartbeat when a renewal
is refused, or when Redis stayed unreachable until the lease ran out locally) and checks it, or
the stricter `Lease.held()`, between training steps.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import redis.asyncio as aioredis
import structlog
from redis.exceptions import RedisError

from pml_common import redis_keys

#: Redis counter from which every acquisition of the trainer lock takes its fencing token.
FENCING_COUNTER_KEY = redis_keys.TRAINER_FENCING
#: Key of the trainer lock.
DEFAULT_LOCK_NAME = redis_keys.TRAINER_LOCK

log = structlog.get_logger("pml_common.lease_lock")

# Acquire: only when nobody holds the lock, then take the next token. The stored value
# "<token>:<owner>" names both, so renew/release compare against exactly this acquisition
# (the same owner re-acquiring later gets a different value).
_ACQUIRE = """
if redis.call('EXISTS', KEYS[1]) == 1 then
  return false
end
local token = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], token .. ':' .. ARGV[1], 'PX', ARGV[2])
return token
"""

# Renew: PEXPIRE only while the key still holds our value (compare-and-expire).
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# Release: DEL only while the key still holds our value (compare-and-delete).
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
"""

_REDIS_ERRORS = (RedisError, OSError, TimeoutError)


def default_owner() -> str:
    """Unique name of this holder: host, pid and a random suffix (two locks in one process)."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass
class Lease:
    """One acquisition of a `LeaseLock`.

    `expires_at` is a `time.monotonic()` deadline that is never later than the expiry Redis
    applies: it is measured from the moment the acquire or renew command was *sent*.
    """

    name: str
    owner: str
    token: int
    lease_ms: int
    expires_at: float
    lost: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def value(self) -> str:
        """The lock key's value while this lease holds it."""
        return f"{self.token}:{self.owner}"

    def remaining_s(self) -> float:
        return max(0.0, self.expires_at - time.monotonic())

    def held(self) -> bool:
        """True while the lease is neither lost nor past its local deadline.

        Stricter than `not lost.is_set()`: it does not depend on the heartbeat task having run,
        so it is right even when the event loop was blocked past the deadline.
        """
        return not self.lost.is_set() and time.monotonic() < self.expires_at


class LeaseLock:
    """A named lease lock in Redis; see the module docstring."""

    def __init__(
        self,
        redis: aioredis.Redis,
        name: str = DEFAULT_LOCK_NAME,
        *,
        lease_ms: int,
        owner: str | None = None,
        fencing_key: str = FENCING_COUNTER_KEY,
    ) -> None:
        if lease_ms < 3:
            raise ValueError("lease_ms must be at least 3 (renewal runs every third)")
        self._redis = redis
        self.name = name
        self.lease_ms = lease_ms
        self.owner = owner or default_owner()
        self.fencing_key = fencing_key
        self._acquire = redis.register_script(_ACQUIRE)
        self._renew = redis.register_script(_RENEW)
        self._release = redis.register_script(_RELEASE)

    async def try_acquire(self) -> Lease | None:
        """Take the lock if it is free; the lease carries a new fencing token."""
        sent = time.monotonic()
        token = await self._acquire(
            keys=[self.name, self.fencing_key], args=[self.owner, self.lease_ms]
        )
        if token is None:
            return None
        lease = Lease(
            name=self.name,
            owner=self.owner,
            token=int(token),
            lease_ms=self.lease_ms,
            expires_at=sent + self.lease_ms / 1000,
        )
        log.info("lease.acquired", lock=self.name, owner=self.owner, token=lease.token)
        return lease

    async def acquire(self, poll_s: float, stop: asyncio.Event) -> Lease | None:
        """Wait until the lock is ours (the lease) or `stop` is set (None).

        Redis errors while waiting are logged and retried: a trainer waiting for the lock
        should outlive a Redis restart.
        """
        while not stop.is_set():
            try:
                lease = await self.try_acquire()
            except _REDIS_ERRORS as exc:
                log.warning("lease.acquire_failed", lock=self.name, error=repr(exc))
                lease = None
            if lease is not None:
                return lease
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=poll_s)
        return None

    async def renew(self, lease: Lease) -> bool:
        """Extend the lease by `lease_ms`; False (and `lease.lost` set) if it is no longer ours.

        Redis errors propagate: whether the lease still holds is then unknown.
        """
        sent = time.monotonic()
        renewed = bool(await self._renew(keys=[lease.name], args=[lease.value, lease.lease_ms]))
        if renewed:
            lease.expires_at = sent + lease.lease_ms / 1000
        else:
            self._lose(lease, "renewal refused: the lease expired or another owner holds it")
        return renewed

    async def release(self, lease: Lease) -> bool:
        """Delete the lock if this lease still holds it; True when it did."""
        lease.lost.set()  # whatever Redis says, the holder must stop acting on it now
        released = bool(await self._release(keys=[lease.name], args=[lease.value]))
        log.info("lease.released", lock=lease.name, token=lease.token, released=released)
        return released

    @contextlib.asynccontextmanager
    async def hold(self, lease: Lease) -> AsyncIterator[Lease]:
        """Keep `lease` renewed while the block runs; release it on exit.

        The block must check `lease.lost` (or `lease.held()`) between steps and stop when set.
        """
        heartbeat = asyncio.create_task(self._heartbeat(lease), name=f"lease-heartbeat-{self.name}")
        try:
            yield lease
        finally:
            # The flag ends the heartbeat's loop even if the cancellation below is swallowed:
            # a cancel landing inside a Redis call can surface as a timeout the loop retries.
            lease.lost.set()
            heartbeat.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await heartbeat
            try:
                await self.release(lease)
            except _REDIS_ERRORS as exc:
                # The lease expires by itself; nothing else to do.
                log.warning("lease.release_failed", lock=lease.name, error=repr(exc))

    async def _heartbeat(self, lease: Lease) -> None:
        """Renew every third of the lease until a renewal is refused or the lease runs out.

        A renewal that errors is retried at the next beat; each attempt is bounded by the time
        the lease has left, so a hung connection cannot keep `lost` unset past the deadline.
        """
        interval_s = lease.lease_ms / 3000
        while not lease.lost.is_set():
            await asyncio.sleep(min(interval_s, lease.remaining_s()))
            left = lease.remaining_s()
            if left <= 0:
                self._lose(lease, "lease ran out while Redis could not be reached")
                return
            try:
                async with asyncio.timeout(left):
                    if not await self.renew(lease):
                        return
            except _REDIS_ERRORS as exc:
                task = asyncio.current_task()
                if task is not None and task.cancelling():
                    raise asyncio.CancelledError from exc  # being stopped, not a Redis failure
                log.warning(
                    "lease.renew_failed", lock=lease.name, token=lease.token, error=repr(exc)
                )

    def _lose(self, lease: Lease, reason: str) -> None:
        if not lease.lost.is_set():
            lease.lost.set()
            log.warning("lease.lost", lock=lease.name, token=lease.token, reason=reason)
