"""Two trainer processes on one Redis: one trains at a time, and a killed holder is replaced.

Real `python -m pml_trainer` processes, real Redis and Neo4j. Executions keep arriving so
both replicas always have something to train; every round's [start, end] interval is read
from the processes' JSON logs and intervals of different processes must never overlap.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from pml_common.bus import EventBus
from pml_common.events import ExecutionCompleted, ExecutionStep, ToolSpec, ToolsRegistered
from pml_common.local_runtime import free_port
from pml_common.settings import Settings

LEASE_MS = 2000
TOOLS = [
    ToolSpec(id=f"demo:t{i}", server="demo", name=f"t{i}", description=f"tool number {i}")
    for i in range(6)
]


def _start_trainer(
    env: dict[str, str], name: str, logs: Path
) -> tuple[subprocess.Popen[bytes], Path]:
    log_path = logs / f"{name}.log"
    env = {
        **env,
        "PML_CONSUMER_NAME": name,
        "PML_TRAINER_PORT": str(free_port()),
        "PML_LOG_FORMAT": "json",
        "PML_TRAINER_LEASE_MS": str(LEASE_MS),
        "PML_REPLAY_MIN_TRACES": "1",
        "PML_TRAIN_STEPS": "8",
        "PML_TRAIN_POLL_S": "0.2",
        "PML_TRAIN_BATCH_SIZE": "8",
    }
    with log_path.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "pml_trainer"], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    return proc, log_path


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


async def _publish_for(settings: Settings, tenant: str, seconds: float) -> None:
    async with EventBus(settings, "test-publisher") as bus:
        await bus.publish(ToolsRegistered.create(tenant_id=tenant, tools=TOOLS))
        deadline = time.monotonic() + seconds
        i = 0
        while time.monotonic() < deadline:
            pair = [TOOLS[i % 6].id, TOOLS[(i + 1) % 6].id]
            await bus.publish(
                ExecutionCompleted.create(
                    tenant_id=tenant,
                    intent=f"do thing {i}",
                    steps=[ExecutionStep(node_id=t, success=True) for t in pair],
                    outcome="success",
                )
            )
            i += 1
            await asyncio.sleep(0.2)


@pytest.mark.timeout(240)
def test_one_trainer_trains_at_a_time_and_a_killed_holder_is_replaced(
    settings: Settings, settings_env: dict[str, str], tenant: str, tmp_path: Path
) -> None:
    a, a_log = _start_trainer(settings_env, "trainer-a", tmp_path)
    b, b_log = _start_trainer(settings_env, "trainer-b", tmp_path)
    procs = {"trainer-a": (a, a_log), "trainer-b": (b, b_log)}
    try:
        asyncio.run(_publish_for(settings, tenant, 25.0))
        # the holder is whoever started the latest round
        last = {
            name: max(
                (r["at"] for r in _events(log) if r.get("event") == "learning.round_started"),
                default=0.0,
            )
            for name, (_, log) in procs.items()
        }
        holder = max(last, key=last.__getitem__)
        assert last[holder] > 0, "no trainer trained at all"
        other = next(n for n in procs if n != holder)
        killed_at = time.time()
        os.kill(procs[holder][0].pid, signal.SIGKILL)
        procs[holder][0].wait(10)
        asyncio.run(_publish_for(settings, tenant, 3 * LEASE_MS / 1000))
        taken_over = [
            r["at"]
            for r in _events(procs[other][1])
            if r.get("event") == "learning.round_started" and r["at"] > killed_at
        ]
        assert taken_over, f"{other} never trained after {holder} was killed"
        assert taken_over[0] - killed_at <= 2 * LEASE_MS / 1000, taken_over[0] - killed_at
    finally:
        for proc, _ in procs.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
    mine = {name: _intervals(log, open_until=killed_at) for name, (_, log) in procs.items()}
    assert all(mine.values()), f"both trainers must have trained at some point: {mine}"
    overlaps = [
        (x, y) for x in mine["trainer-a"] for y in mine["trainer-b"] if x[0] < y[1] and y[0] < x[1]
    ]
    assert overlaps == [], overlaps
