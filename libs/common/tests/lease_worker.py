"""A separate OS process contending for a `LeaseLock`, driven by `test_lease_lock.py`.

    python lease_worker.py loop REDIS_URL LOCK FENCING LEASE_MS DURATION_S WORKER_ID INTERVALS_KEY
        acquire -> simulated work steps while holding -> release, for DURATION_S seconds; each
        step done while the lease was held is pushed to INTERVALS_KEY as JSON
        [worker, token, start, end] (time.monotonic(), which is system-wide on Linux).
        Now and then the worker blocks its event loop for longer than the lease (a GC pause),
        so that its lease really expires under it.
    python lease_worker.py hold REDIS_URL LOCK FENCING LEASE_MS
        acquire, print "ACQUIRED <token>", then keep the lease renewed until killed.

Logs go to stderr; stdout carries only the lines above.
"""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time

import redis.asyncio as aioredis
import structlog

from pml_common.lease_lock import LeaseLock

# Share of holds that stall the event loop for 1.2 leases while holding (often enough that
# a holder acting on an expired lease would show up as an overlap in every run).
STALL_SHARE = 0.3


async def loop(
    url: str, name: str, fencing: str, lease_ms: int, duration_s: float, worker: str, key: str
) -> None:
    client = aioredis.Redis.from_url(url)
    lock = LeaseLock(client, name, lease_ms=lease_ms, owner=worker, fencing_key=fencing)
    rng = random.Random(worker)
    stop = asyncio.Event()
    end_at = time.monotonic() + duration_s
    while time.monotonic() < end_at:
        lease = await lock.acquire(poll_s=0.005, stop=stop)
        assert lease is not None
        async with lock.hold(lease):
            # Up to 1.5 leases long: holds that outlive the lease need the heartbeat.
            hold_until = time.monotonic() + rng.uniform(0.02, 1.5 * lease_ms / 1000)
            stall = rng.random() < STALL_SHARE
            while time.monotonic() < hold_until and lease.held():
                start = time.monotonic()
                await asyncio.sleep(rng.uniform(0.002, 0.02))
                if stall:
                    # A deliberate freeze of the whole loop: the heartbeat cannot run either.
                    time.sleep(1.2 * lease_ms / 1000)  # noqa: ASYNC251
                    stall = False
                end = time.monotonic()
                if lease.held():  # the step only counts if the lease covered all of it
                    await client.rpush(key, json.dumps([worker, lease.token, start, end]))
        # Let the other process in now and then, as a trainer between rounds would.
        await asyncio.sleep(rng.uniform(0, 0.01))
    await client.aclose()


async def hold(url: str, name: str, fencing: str, lease_ms: int) -> None:
    client = aioredis.Redis.from_url(url)
    lock = LeaseLock(client, name, lease_ms=lease_ms, fencing_key=fencing)
    lease = await lock.acquire(poll_s=0.01, stop=asyncio.Event())
    assert lease is not None
    async with lock.hold(lease):
        print(f"ACQUIRED {lease.token}", flush=True)
        await lease.lost.wait()


def main(argv: list[str]) -> None:
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(sys.stderr))
    mode, url, name, fencing, lease_ms = argv[:5]
    if mode == "loop":
        duration_s, worker, key = argv[5:8]
        asyncio.run(loop(url, name, fencing, int(lease_ms), float(duration_s), worker, key))
    elif mode == "hold":
        asyncio.run(hold(url, name, fencing, int(lease_ms)))
    else:
        raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    main(sys.argv[1:])
