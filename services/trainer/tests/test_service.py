"""`python -m pml_trainer` as a real process: events in through the bus, graph and GraphChanged out."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import TypeVar

import pytest
from redis.asyncio import Redis

from pml_common.events import (
    ExecutionCompleted,
    ExecutionStep,
    GraphChanged,
    TenantDeleted,
    ToolSpec,
    ToolsRegistered,
)
from pml_common.lease_lock import FENCING_COUNTER_KEY
from pml_common.model_registry import ModelRegistry
from pml_common.settings import Settings
from pml_common.testing import eventually, service_process
from pml_trainer.graph_store import GraphStore
from pml_trainer.replay_buffer import ReplayBuffer

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("pml_common.bus") is None, reason="pml_common.bus not written yet"
)

T = TypeVar("T")
TOOLS = [
    ToolSpec(
        id="git:git_add",
        server="git",
        name="git_add",
        description="Adds file contents to the staging area",
    ),
    ToolSpec(
        id="git:git_commit",
        server="git",
        name="git_commit",
        description="Records changes to the repository",
    ),
    ToolSpec(
        id="fetch:fetch",
        server="fetch",
        name="fetch",
        description="Fetches a URL from the internet and extracts its contents as markdown.",
    ),
    ToolSpec(
        id="filesystem:write_file",
        server="filesystem",
        name="write_file",
        description="Create a new file or completely overwrite an existing file.",
    ),
]


@pytest.fixture
def trainer(settings_env: dict[str, str], tmp_path: Path) -> Iterator[subprocess.Popen[bytes]]:
    with service_process(
        "pml_trainer", "PML_TRAINER_PORT", settings_env, tmp_path / "trainer.log", within_s=90
    ) as service:
        proc = service.proc
        yield proc
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pytest.fail("trainer did not stop within 30s of SIGTERM")
        assert proc.returncode == 0, service.log_tail()


async def test_trainer_process_applies_events_and_announces_changes(
    trainer: subprocess.Popen[bytes],
    settings: Settings,
    store: GraphStore,
    tenant: str,
    redis: Redis,
) -> None:
    from pml_common.bus import EventBus

    announced: list[GraphChanged] = []

    async def collect(event: GraphChanged) -> None:
        if event.tenant_id == tenant:
            announced.append(event)

    bus = EventBus(settings, "trainer-service-test")
    bus.subscribe(GraphChanged, f"test-{tenant}", collect)
    await bus.start()
    try:
        await bus.publish(ToolsRegistered.create(tenant_id=tenant, tools=TOOLS))
        edges = await eventually(lambda: store.edges(tenant), lambda e: len(e) > 0, within_s=60)
        # Different servers, dissimilar descriptions: the template edge stands as written.
        assert ("fetch:fetch", "filesystem:write_file", "template") in {
            (e.src, e.dst, e.source) for e in edges
        }

        steps = [ExecutionStep(node_id=t, success=True) for t in ("git:git_add", "git:git_commit")]
        for _ in range(3):
            await bus.publish(
                ExecutionCompleted.create(
                    tenant_id=tenant, intent="commit", steps=steps, outcome="success"
                )
            )

        def promoted(edges: list) -> bool:
            return any(
                (e.src, e.dst, e.source, e.count)
                == ("git:git_add", "git:git_commit", "observed", 3)
                for e in edges
            )

        await eventually(lambda: store.edges(tenant), promoted, within_s=60)
        stats = await store.success_stats(tenant, ["git:git_commit"])
        assert stats["git:git_commit"].executions == 3
        await eventually(
            lambda: _reasons(announced),
            # Separate streams are consumed concurrently: the order between them is not fixed.
            lambda r: sorted(r) == ["execution_completed"] * 3 + ["tools_registered"],
            within_s=60,
        )

        # A model version of the tenant, as a trainer holding the lock would have published it.
        registry = ModelRegistry(redis)
        token = int(await redis.incr(FENCING_COUNTER_KEY))
        await registry.publish(tenant, b"model", token)
        replay = ReplayBuffer(redis, capacity=10)
        assert await replay.size(tenant) == 3  # the executions were buffered

        await bus.publish(TenantDeleted.create(tenant_id=tenant))
        await eventually(lambda: store.edges(tenant), lambda e: e == [], within_s=60)
        await eventually(
            lambda: _reasons(announced), lambda r: r[-1] == "tenant_deleted", within_s=60
        )
        # what was learned for the tenant is gone with it
        assert await replay.size(tenant) == 0
        assert await registry.current(tenant) is None
    finally:
        await bus.stop()


async def _reasons(events: list[GraphChanged]) -> list[str]:
    return [e.reason for e in events]
