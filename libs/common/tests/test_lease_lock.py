from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import sys
import time
from pathlib import Path

import pytest
import redis.asyncio as aioredis

from pml_common.lease_lock import (
    DEFAULT_LOCK_NAME,
    FENCING_COUNTER_KEY,
    Lease,
    LeaseLock,
)
from pml_common.local_runtime import start_redis
from pml_common.settings import Settings
from pml_common.stores import redis_client

WORKER = Path(__file__).with_name("lease_worker.py")


@pytest.fixture
def names(tenant: str) -> tuple[str, str]:
    """A lock and a fencing counter of the test's own (the real ones are shared)."""
    return f"pml:test:{tenant}:lock", f"pml:test:{tenant}:fencing"


def make_lock(
    redis: aioredis.Redis, names: tuple[str, str], owner: str, lease_ms: int = 600
) -> LeaseLock:
    return LeaseLock(redis, names[0], lease_ms=lease_ms, owner=owner, fencing_key=names[1])


@pytest.fixture
def locks(redis: aioredis.Redis, names: tuple[str, str]) -> tuple[LeaseLock, LeaseLock]:
    """Two contenders, owners "a" and "b", for the test's lock (600 ms leases)."""
    return make_lock(redis, names, "a"), make_lock(redis, names, "b")


async def acquired(lock: LeaseLock) -> Lease:
    """A lease from `lock.try_acquire()`, which must get one."""
    lease = await lock.try_acquire()
    assert lease is not None
    return lease


def test_defaults_are_the_trainer_lock() -> None:
    lock = LeaseLock(aioredis.Redis(), lease_ms=10_000)
    assert lock.name == DEFAULT_LOCK_NAME == "pml:trainer:lock"
    assert lock.fencing_key == FENCING_COUNTER_KEY == "pml:trainer:fencing"
    assert lock.owner != LeaseLock(aioredis.Redis(), lease_ms=10_000).owner


async def test_mutual_exclusion_and_stored_value(
    redis: aioredis.Redis, names: tuple[str, str], locks: tuple[LeaseLock, LeaseLock]
) -> None:
    a, b = locks
    lease = await acquired(a)
    assert await b.try_acquire() is None
    assert await a.try_acquire() is None  # not re-entrant either
    assert await redis.get(names[0]) == f"{lease.token}:a".encode()
    assert 0 < await redis.pttl(names[0]) <= 600

    assert await a.release(lease) is True
    assert await redis.exists(names[0]) == 0
    assert await b.try_acquire() is not None


async def test_tokens_strictly_increase(
    redis: aioredis.Redis, names: tuple[str, str], locks: tuple[LeaseLock, LeaseLock]
) -> None:
    tokens = []
    for lock in itertools.islice(itertools.cycle(locks), 6):
        lease = await acquired(lock)
        tokens.append(lease.token)
        await lock.release(lease)
    assert tokens == sorted(set(tokens))
    assert int(await redis.get(names[1])) == tokens[-1]


async def test_renew_keeps_the_lease(
    redis: aioredis.Redis, names: tuple[str, str], locks: tuple[LeaseLock, LeaseLock]
) -> None:
    a, b = locks
    lease = await acquired(a)
    for _ in range(6):  # 1.2 s in all, two leases
        await asyncio.sleep(0.2)
        assert await a.renew(lease) is True
        assert await b.try_acquire() is None
    assert lease.held()
    assert 0 < await redis.pttl(names[0]) <= 600


async def test_unrenewed_lease_expires_and_next_token_is_bigger(
    redis: aioredis.Redis, names: tuple[str, str]
) -> None:
    a, b = make_lock(redis, names, "a", lease_ms=300), make_lock(redis, names, "b", lease_ms=300)
    old = await acquired(a)
    assert await b.try_acquire() is None
    await asyncio.sleep(0.4)
    assert not old.held()  # the local deadline passed too

    new = await acquired(b)
    assert new.token > old.token
    # The stale holder can neither renew nor release the new holder's lease.
    assert await a.renew(old) is False
    assert old.lost.is_set()
    assert await a.release(old) is False
    assert await redis.get(names[0]) == new.value.encode()


async def test_release_by_non_owner_does_nothing(
    redis: aioredis.Redis, names: tuple[str, str], locks: tuple[LeaseLock, LeaseLock]
) -> None:
    a, b = locks
    lease = await acquired(a)
    impostor = Lease(names[0], "b", lease.token, 600, lease.expires_at)
    assert await b.release(impostor) is False
    # Same owner, but an older acquisition: not this lease either.
    earlier = Lease(names[0], "a", lease.token - 1, 600, lease.expires_at)
    assert await a.release(earlier) is False
    assert await redis.get(names[0]) == lease.value.encode()


async def test_hold_renews_across_several_leases(
    redis: aioredis.Redis, names: tuple[str, str], locks: tuple[LeaseLock, LeaseLock]
) -> None:
    a, b = locks
    lease = await acquired(a)
    async with a.hold(lease):
        for _ in range(15):  # 1.5 s, two and a half leases
            await asyncio.sleep(0.1)
            assert lease.held()
            assert await b.try_acquire() is None
    assert lease.lost.is_set()  # released: the holder must not act on it any more
    assert await redis.exists(names[0]) == 0


@pytest.mark.parametrize("theft", ["deleted", "stolen"])
async def test_lost_is_set_when_the_key_is_taken(
    redis: aioredis.Redis, names: tuple[str, str], theft: str
) -> None:
    a = make_lock(redis, names, "a", lease_ms=600)
    lease = await acquired(a)
    async with a.hold(lease):
        await asyncio.sleep(0.1)
        assert not lease.lost.is_set()
        if theft == "deleted":
            await redis.delete(names[0])
        else:
            await redis.set(names[0], b"999:thief", px=5000)
        started = time.monotonic()
        await asyncio.wait_for(lease.lost.wait(), timeout=1.0)
        # At the next renewal (every 0.2 s), not when the lease would have run out (0.6 s).
        assert time.monotonic() - started < 0.5
        assert not lease.held()
    if theft == "stolen":  # leaving the block must not release the thief's key
        assert await redis.get(names[0]) == b"999:thief"


async def test_lost_is_set_when_redis_stays_down_for_the_lease(tmp_path: Path) -> None:
    server = start_redis(tmp_path / "redis")
    client = redis_client(Settings(redis_url=server.url))
    lock = LeaseLock(client, "pml:test:lock", lease_ms=600, owner="a")
    try:
        lease = await acquired(lock)
        async with lock.hold(lease):
            await asyncio.sleep(0.3)
            server.kill()
            killed = time.monotonic()
            await asyncio.wait_for(lease.lost.wait(), timeout=3.0)
            waited = time.monotonic() - killed
            print(f"redis down: lease lost after {waited:.2f}s")
            # Not before the lease could have run out, and not long after it did.
            assert 0.6 - 0.3 - 0.05 <= waited <= 0.6 + 0.3
    finally:
        await client.aclose()
        server.stop()


async def test_acquire_waits_for_release_or_stop(locks: tuple[LeaseLock, LeaseLock]) -> None:
    a, b = locks
    held = await acquired(a)

    stop = asyncio.Event()
    asyncio.get_running_loop().call_later(0.2, stop.set)
    started = time.monotonic()
    assert await b.acquire(poll_s=0.05, stop=stop) is None
    assert 0.2 <= time.monotonic() - started < 1.0

    asyncio.get_running_loop().call_later(0.2, lambda: asyncio.ensure_future(a.release(held)))
    lease = await b.acquire(poll_s=0.02, stop=asyncio.Event())
    assert lease is not None
    assert lease.token > held.token


async def test_two_processes_never_work_at_the_same_time(
    redis: aioredis.Redis, names: tuple[str, str], settings: Settings
) -> None:
    """Two OS processes contend for a 600 ms lease for 5 s; their work never overlaps.

    Holds last up to 1.5 leases (renewed by the heartbeat), and some holders freeze for longer
    than the lease, so leases do expire under their holders and get taken over.
    """
    key = f"{names[0]}:intervals"
    procs = [
        await asyncio.create_subprocess_exec(
            sys.executable,
            str(WORKER),
            "loop",
            settings.redis_url,
            *names,
            "600",
            "5",
            worker,
            key,
        )
        for worker in ("w1", "w2")
    ]
    codes = await asyncio.wait_for(asyncio.gather(*(p.wait() for p in procs)), timeout=60)
    assert codes == [0, 0]

    rows = [json.loads(raw) for raw in await redis.lrange(key, 0, -1)]
    intervals = sorted((start, end, worker, token) for worker, token, start, end in rows)
    by_worker = {w: [i for i in intervals if i[2] == w] for w in ("w1", "w2")}
    holds = {w: len({i[3] for i in ivs}) for w, ivs in by_worker.items()}
    print(f"{len(intervals)} work intervals; holds per worker: {holds}")
    assert all(n >= 2 for n in holds.values()), "both processes must have held the lock"

    overlaps = [
        (x, y)
        for x, y in itertools.combinations(intervals, 2)
        if x[2] != y[2] and x[0] < y[1] and y[0] < x[1]
    ]
    assert overlaps == []
    # Work follows the order of the fencing tokens.
    tokens = [i[3] for i in intervals]
    assert tokens == sorted(tokens)


async def test_killed_holder_is_replaced_within_two_leases(
    redis: aioredis.Redis, names: tuple[str, str], settings: Settings
) -> None:
    lease_ms = 600
    holder = await asyncio.create_subprocess_exec(
        sys.executable,
        str(WORKER),
        "hold",
        settings.redis_url,
        *names,
        str(lease_ms),
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        assert holder.stdout is not None
        line = await asyncio.wait_for(holder.stdout.readline(), timeout=30)
        assert line.startswith(b"ACQUIRED "), line
        their_token = int(line.split()[1])

        other = make_lock(redis, names, "other", lease_ms=lease_ms)
        await asyncio.sleep(2 * lease_ms / 1000)  # the holder's heartbeat keeps it
        assert await other.try_acquire() is None

        holder.kill()  # SIGKILL: no release, no more renewals
        killed = time.monotonic()
        stop = asyncio.Event()
        asyncio.get_running_loop().call_later(2 * lease_ms / 1000, stop.set)
        lease = await other.acquire(poll_s=0.02, stop=stop)
        waited = time.monotonic() - killed
        print(f"holder killed: lock taken over after {waited:.2f}s")
        assert lease is not None, "not acquired within two lease periods"
        assert lease.token > their_token
        assert waited < 2 * lease_ms / 1000
    finally:
        if holder.returncode is None:
            holder.kill()
        await holder.wait()


async def test_leaving_hold_stops_the_heartbeat_even_when_a_renewal_swallows_the_cancel(
    redis: aioredis.Redis, names: tuple[str, str]
) -> None:
    name, fencing = names

    class SwallowingLock(LeaseLock):
        """The first renewal turns a cancel into a timeout, as a Redis call caught mid-read
        can; later renewals work, so a heartbeat that ignored the cancel would run forever."""

        swallowed = False

        async def renew(self, lease: Lease) -> bool:
            if not self.swallowed:
                try:
                    await asyncio.sleep(0.2)
                except asyncio.CancelledError:
                    self.swallowed = True
                    raise TimeoutError("a cancel surfacing as a timeout") from None
            return await super().renew(lease)

    lock = SwallowingLock(redis, name, lease_ms=1500, fencing_key=fencing)
    lease = await acquired(lock)
    started = time.monotonic()
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(10):  # a heartbeat that ignores the cancel never ends
            async with lock.hold(lease):
                await asyncio.sleep(0.6)  # the heartbeat (every 0.5 s) is now inside renew()
    assert time.monotonic() - started < 5, "leaving hold() waited on its heartbeat"
    assert lock.swallowed
    assert lease.lost.is_set()
