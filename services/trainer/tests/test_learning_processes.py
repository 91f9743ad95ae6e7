"""Trainer processes on one Redis: one trains at a time, a killed holder is replaced, and a
restarted trainer learns from the replay buffer its killed predecessor filled.

Real `python -m pml_trainer` processes, real Redis and Neo4j. In the lock test executions keep
arriving so both replicas always have something to train; every round's [start, end] interval
is read from the processes' JSON logs and intervals of different processes must never overlap.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis

from pml_common.bus import EventBus
from pml_common.events import ExecutionCompleted, ExecutionStep, ToolSpec, ToolsRegistered
from pml_common.model_registry import ModelRecord, ModelRegistry
from pml_common.settings import Settings
from pml_common.testing import ServiceProcess, eventually, service_process
from pml_trainer.replay_buffer import ReplayBuffer

LEASE_MS = 2000
TOOLS = [
    ToolSpec(id=f"demo:t{i}", server="demo", name=f"t{i}", description=f"tool number {i}")
    for i in range(6)
]


@contextlib.contextmanager
def _trainer(
    env: dict[str, str], name: str, logs: Path, **overrides: str
) -> Iterator[ServiceProcess]:
    """A trainer process with a short lease and tiny rounds that start at once (a steady
    stream is trained without waiting for it to pause); SIGTERM when the block ends."""
    env = {
        **env,
        "PML_CONSUMER_NAME": name,
        "PML_LOG_FORMAT": "json",
        "PML_TRAINER_LEASE_MS": str(LEASE_MS),
        "PML_REPLAY_MIN_TRACES": "1",
        "PML_TRAIN_STEPS": "8",
        "PML_TRAIN_POLL_S": "0.2",
        "PML_TRAIN_BATCH_SIZE": "8",
        "PML_TRAIN_QUIET_S": "0",
        "PML_TRAIN_MAX_WAIT_S": "0",
        **overrides,
    }
    log = logs / f"{name}.log"
    with service_process("pml_trainer", "PML_TRAINER_PORT", env, log, graceful=True) as trainer:
        yield trainer


def _events(path: Path) -> list[dict[str, Any]]:
    rows = []
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return rows


def _intervals(path: Path, open_until: float) -> list[tuple[float, float]]:
    """[start, end] of every round; a round still open (killed holder) ends at `open_until`."""
    intervals, start = [], None
    for row in _events(path):
        if row.get("event") == "learning.round_started":
            start = row["at"]
        elif row.get("event") in ("learning.round_finished", "learning.round_abandoned"):
            intervals.append((row["started_at"], row["at"]))
            start = None
    if start is not None:
        intervals.append((start, open_until))
    return intervals


def _execution(tenant: str, i: int) -> ExecutionCompleted:
    pair = [TOOLS[i % 6].id, TOOLS[(i + 1) % 6].id]
    return ExecutionCompleted.create(
        tenant_id=tenant,
        intent=f"do thing {i}",
        steps=[ExecutionStep(node_id=t, success=True) for t in pair],
        outcome="success",
    )


async def _publish_for(settings: Settings, tenant: str, seconds: float) -> None:
    async with EventBus(settings, "test-publisher") as bus:
        await bus.publish(ToolsRegistered.create(tenant_id=tenant, tools=TOOLS))
        deadline = time.monotonic() + seconds
        i = 0
        while time.monotonic() < deadline:
            await bus.publish(_execution(tenant, i))
            i += 1
            await asyncio.sleep(0.2)


@pytest.mark.timeout(240)
def test_one_trainer_trains_at_a_time_and_a_killed_holder_is_replaced(
    settings: Settings, settings_env: dict[str, str], tenant: str, tmp_path: Path
) -> None:
    with contextlib.ExitStack() as stack:
        procs = {
            name: stack.enter_context(_trainer(settings_env, name, tmp_path))
            for name in ("trainer-a", "trainer-b")
        }
        asyncio.run(_publish_for(settings, tenant, 25.0))
        # the holder is whoever started the latest round
        last = {
            name: max(
                (r["at"] for r in _events(t.log) if r.get("event") == "learning.round_started"),
                default=0.0,
            )
            for name, t in procs.items()
        }
        holder = max(last, key=last.__getitem__)
        assert last[holder] > 0, "no trainer trained at all"
        other = next(n for n in procs if n != holder)
        killed_at = time.time()
        os.kill(procs[holder].proc.pid, signal.SIGKILL)
        procs[holder].proc.wait(10)
        asyncio.run(_publish_for(settings, tenant, 3 * LEASE_MS / 1000))
        taken_over = [
            r["at"]
            for r in _events(procs[other].log)
            if r.get("event") == "learning.round_started" and r["at"] > killed_at
        ]
        assert taken_over, f"{other} never trained after {holder} was killed"
        assert taken_over[0] - killed_at <= 2 * LEASE_MS / 1000, taken_over[0] - killed_at
    mine = {name: _intervals(t.log, open_until=killed_at) for name, t in procs.items()}
    assert all(mine.values()), f"both trainers must have trained at some point: {mine}"
    overlaps = [
        (x, y) for x in mine["trainer-a"] for y in mine["trainer-b"] if x[0] < y[1] and y[0] < x[1]
    ]
    assert overlaps == [], overlaps


@pytest.mark.timeout(240)
async def test_a_restarted_trainer_learns_from_the_buffer_the_killed_one_filled(
    settings: Settings, settings_env: dict[str, str], tenant: str, tmp_path: Path, redis: Redis
) -> None:
    buffer = ReplayBuffer(redis, capacity=100)
    registry = ModelRegistry(redis)
    executions = 12
    # Every 5th execution is held back to judge versions (pml_trainer.holdout), not learned.
    held = executions // 5
    learned = executions - held
    # The first trainer buffers the executions but needs more traces than it gets to train.
    with _trainer(settings_env, "trainer-1", tmp_path, PML_REPLAY_MIN_TRACES="1000") as first:
        async with EventBus(settings, "test-publisher") as bus:
            await bus.publish(ToolsRegistered.create(tenant_id=tenant, tools=TOOLS))
            for i in range(executions):
                await bus.publish(_execution(tenant, i))
        await eventually(lambda: buffer.size(tenant), lambda n: n == learned, within_s=60)
        first.proc.kill()
        first.proc.wait(10)
    assert await buffer.size(tenant) == learned
    assert await registry.current_record(tenant) is None
    # A new process, no new execution: all it can learn from is what the buffer kept.
    with _trainer(settings_env, "trainer-2", tmp_path, PML_REPLAY_MIN_TRACES=str(learned)):
        record = await eventually(
            lambda: _judged(registry, tenant), lambda r: r is not None, within_s=120
        )
    # published or kept as rejected, the version learned from every buffered trace and was
    # judged on the held-back ones
    assert record is not None and record.metrics["traces_seen"] == learned
    assert record.metrics["holdout_size"] == held


async def _judged(registry: ModelRegistry, tenant: str) -> ModelRecord | None:
    """The tenant's trained version, published or rejected by the gate."""
    current = await registry.current_record(tenant)
    if current is not None:
        return current
    rejected = await registry.last_rejected(tenant)
    return rejected[0] if rejected else None
