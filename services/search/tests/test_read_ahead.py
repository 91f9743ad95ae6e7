"""Reads ahead of questions: when they happen, and what stops them."""

from __future__ import annotations

import asyncio

from structlog.testing import capture_logs

from pml_search.read_ahead import ReadAhead


class Reads:
    def __init__(self) -> None:
        self.tenants: list[str] = []

    async def read(self, tenant: str) -> None:
        self.tenants.append(tenant)


async def read_within(reads: Reads, count: int, seconds: float) -> bool:
    for _ in range(round(seconds / 0.01)):
        if len(reads.tenants) >= count:
            return True
        await asyncio.sleep(0.01)
    return False


async def test_a_tenant_is_read_once_it_has_been_quiet() -> None:
    reads = Reads()
    ahead = ReadAhead("test", reads.read, delay_s=0.1)
    ahead.changed("a", 0.0)
    await asyncio.sleep(0.06)
    ahead.changed("a", 0.0)  # each change postpones the read
    ahead.changed("b", 0.0)
    await asyncio.sleep(0.06)
    assert reads.tenants == []
    assert await read_within(reads, 2, 2.0)
    await asyncio.sleep(0.2)
    assert sorted(reads.tenants) == ["a", "b"]  # once each


async def test_a_slow_read_waits_twenty_times_its_duration() -> None:
    reads = Reads()
    ahead = ReadAhead("test", reads.read, delay_s=0.01)
    ahead.changed("a", 0.05)  # 20 × 0.05 s: a second
    assert not await read_within(reads, 1, 0.7)
    assert await read_within(reads, 1, 2.0)


async def test_dropped_and_closed_reads_do_not_happen() -> None:
    reads = Reads()
    ahead = ReadAhead("test", reads.read, delay_s=0.05)
    ahead.changed("a", 0.0)
    ahead.drop("a")
    ahead.changed("b", 0.0)
    await ahead.close()
    assert not await read_within(reads, 1, 0.3)


async def test_a_failing_read_is_logged() -> None:
    async def failing(tenant: str) -> None:
        raise RuntimeError(f"{tenant} unreadable")

    ahead = ReadAhead("test", failing, delay_s=0.01)
    with capture_logs() as logs:
        ahead.changed("a", 0.0)
        await asyncio.sleep(0.2)
    # (other tests' background work may log meanwhile: only this cache's events count)
    failures = [e for e in logs if e.get("cache") == "test"]
    assert [(e["event"], e["tenant"]) for e in failures] == [("search.read_ahead_failed", "a")]
