"""Failure drills on real processes: trainers SIGKILLed mid-batch or while holding the lock, and
a sustained load of executions, each reconciled through the system's public interfaces.

The drills share a private Redis (the trainer lock and the consumer groups are per Redis, so no
other test's trainer takes part) and the suite's Neo4j, each tenant their own. Search runs for
the whole module and answers `GetNode`, whose `executions` is the trainer's count: it must end
exactly at the number of distinct executions published (loss = 0, duplicates = 0).

Each drill prints its measured figures as one `drill {...}` JSON line (`pytest -s` shows them);
docs/operations.md, "Failure drills", records them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
import uuid
from collections.abc import Collection, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest
import redis

from pml.v1 import common_pb2, search_pb2, search_pb2_grpc
from pml_cli.local_stack import LocalStack, settings_to_env
from pml_common.bus import EventBus
from pml_common.events import ExecutionCompleted, ExecutionStep, ModelPublished, Streams
from pml_common.lease_lock import DEFAULT_LOCK_NAME
from pml_common.local_runtime import ManagedProcess, start_redis
from pml_common.model_registry import ModelRecord, ModelRegistry
from pml_common.settings import Settings
from pml_common.stores import redis_client
from pml_common.testing import ServiceProcess, service_process, until

pytestmark = pytest.mark.e2e

#: Pending entries idle this long are reclaimed from a dead consumer.
RECLAIM_IDLE_MS = 1000
#: Distinct executions of the sustained load.
LOAD_EVENTS = 2000
#: Lease of the trainer lock in the lock drill.
LEASE_MS = 2000
#: Trainer group and the stream of executions it consumes.
GROUP = "trainer"
EXECUTIONS = Streams.EXECUTION_COMPLETED
TOOLS = [f"drill:tool_{i}" for i in range(32)]


def report(drill: str, **figures: Any) -> None:
    """One line of measured figures per drill (collected into docs/operations.md)."""
    print("drill " + json.dumps({"drill": drill, **figures}), flush=True)


@pytest.fixture(scope="module")
def drill_redis(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ManagedProcess]:
    proc = start_redis(tmp_path_factory.mktemp("drill-redis"))
    yield proc
    proc.stop()


@pytest.fixture(scope="module")
def drill_settings(
    drill_redis: ManagedProcess,
    neo4j_server: ManagedProcess,
    tmp_path_factory: pytest.TempPathFactory,
) -> Settings:
    stack = LocalStack.on_free_ports(
        tmp_path_factory.mktemp("drills"),
        reclaim_idle_ms=RECLAIM_IDLE_MS,
        trainer_lease_ms=LEASE_MS,
        log_format="json",
    )
    return stack.settings.model_copy(
        update={"redis_url": drill_redis.url, "neo4j_uri": neo4j_server.url}
    )


@pytest.fixture(scope="module")
def drill_env(drill_settings: Settings) -> dict[str, str]:
    return {**os.environ, **settings_to_env(drill_settings)}


@pytest.fixture(scope="module")
def search(
    drill_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[search_pb2_grpc.SearchServiceStub]:
    logs = tmp_path_factory.mktemp("drill-logs")
    env = {**drill_env, "PML_CONSUMER_NAME": "drill-search"}
    with (
        service_process("pml_search", "PML_SEARCH_PORT", env, logs / "search.log") as proc,
        grpc.insecure_channel(proc.address) as channel,
    ):
        yield search_pb2_grpc.SearchServiceStub(channel)


@contextlib.contextmanager
def trainer(
    env: dict[str, str], name: str, logs: Path, **overrides: str
) -> Iterator[ServiceProcess]:
    """A trainer process named `name` in the group; it trains only when told to (overrides)."""
    env = {
        **env,
        "PML_CONSUMER_NAME": name,
        # No training unless a drill wants it: rounds would only compete for the CPU here.
        "PML_REPLAY_MIN_TRACES": "1000000",
        **overrides,
    }
    log = logs / f"{name}.log"
    with service_process("pml_trainer", "PML_TRAINER_PORT", env, log, graceful=True) as proc:
        yield proc


@contextlib.contextmanager
def trainers(
    env: dict[str, str], names: Sequence[str], logs: Path, **overrides: str
) -> Iterator[dict[str, ServiceProcess]]:
    """Several trainers, started side by side (each start loads models and the graph)."""
    starting = {name: trainer(env, name, logs, **overrides) for name in names}
    with contextlib.ExitStack() as stack, ThreadPoolExecutor(len(names)) as pool:
        futures = {name: pool.submit(cm.__enter__) for name, cm in starting.items()}
        started, failures = {}, []
        for name, future in futures.items():
            try:
                started[name] = future.result()
            except Exception as exc:
                failures.append(exc)
            else:
                stack.push(starting[name])
        if failures:
            raise failures[0]
        yield started


@pytest.fixture(scope="module")
def group_trainers(
    drill_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, ServiceProcess]]:
    """The trainer group of the drills' system: three replicas."""
    names = ("drill-trainer-1", "drill-trainer-2", "drill-trainer-3")
    with trainers(drill_env, names, tmp_path_factory.mktemp("trainer-logs")) as procs:
        yield procs


def sigkill(proc: ServiceProcess) -> float:
    """Kill the process abruptly; returns the monotonic time of the kill."""
    os.kill(proc.proc.pid, signal.SIGKILL)
    killed_at = time.monotonic()
    proc.proc.wait(10)
    return killed_at


def register_tools(stub: search_pb2_grpc.SearchServiceStub, tenant: str) -> None:
    tools = [
        common_pb2.Tool(id=t, server="drill", name=t.split(":")[1], description=f"drill {t}")
        for t in TOOLS
    ]
    stub.RegisterTools(search_pb2.RegisterToolsRequest(tenant_id=tenant, tools=tools), timeout=60)


def executions(tenant: str, count: int) -> list[ExecutionCompleted]:
    """`count` executions of one tool each, round robin over TOOLS."""
    return [
        ExecutionCompleted.create(
            tenant_id=tenant,
            intent=f"drill run {i}",
            steps=[ExecutionStep(node_id=TOOLS[i % len(TOOLS)], success=i % 3 != 0)],
            outcome="success" if i % 3 != 0 else "failure",
        )
        for i in range(count)
    ]


def expected_counts(events: Sequence[ExecutionCompleted]) -> dict[str, int]:
    counts = dict.fromkeys(TOOLS, 0)
    for event in {e.event_id: e for e in events}.values():
        counts[event.steps[0].node_id] += 1
    return counts


async def _publish(settings: Settings, events: Sequence[ExecutionCompleted]) -> None:
    async with EventBus(settings, "drill-publisher") as bus:
        for event in events:
            await bus.publish(event)


def publish(settings: Settings, events: Sequence[ExecutionCompleted]) -> None:
    asyncio.run(_publish(settings, events))


def counted(stub: search_pb2_grpc.SearchServiceStub, tenant: str) -> dict[str, int]:
    """The trainer's execution count of each drill tool, as search serves it."""
    counts = {}
    for tool in TOOLS:
        try:
            node = stub.GetNode(search_pb2.GetNodeRequest(tenant_id=tenant, id=tool), timeout=30)
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.NOT_FOUND:
                raise
            counts[tool] = 0
        else:
            counts[tool] = node.executions
    return counts


def group_drained(client: redis.Redis, stream: str, group: str) -> bool:
    """Every entry of `stream` read by `group` and acknowledged."""
    for info in client.xinfo_groups(stream):
        if info["name"] in (group, group.encode()):
            return int(info["pending"]) == 0 and int(info.get("lag") or 0) == 0
    return False


def pending_of(client: redis.Redis, stream: str, group: str, consumer: str) -> int:
    for row in client.xinfo_consumers(stream, group):
        if row["name"] in (consumer, consumer.encode()):
            return int(row["pending"])
    return 0


def reconcile(
    stub: search_pb2_grpc.SearchServiceStub,
    client: redis.Redis,
    tenant: str,
    expected: dict[str, int],
    timeout: float,
) -> tuple[float, dict[str, int]]:
    """Wait until the trainer group has handled and acknowledged everything and search serves
    the expected counts; returns when, and the counts read once more after that."""
    done = until(
        lambda: group_drained(client, EXECUTIONS, GROUP) and counted(stub, tenant) == expected,
        timeout,
        f"counts {expected}",
    )
    return done, counted(stub, tenant)


def dead_letters_of(client: redis.Redis, tenant: str) -> list[dict[bytes, bytes]]:
    rows = client.xrange(Streams.DEAD_LETTER)
    return [fields for _, fields in rows if tenant.encode() in fields.get(b"payload", b"")]


@pytest.fixture
def drill_tenant() -> str:
    return f"drill-{uuid.uuid4().hex[:10]}"


@pytest.fixture
def client(drill_settings: Settings) -> Iterator[redis.Redis]:
    with redis.Redis.from_url(drill_settings.redis_url) as client:
        yield client


@pytest.mark.timeout(240)
def test_consumer_killed_mid_batch_its_entries_are_reclaimed_and_counted_once(
    search: search_pb2_grpc.SearchServiceStub,
    group_trainers: dict[str, ServiceProcess],
    drill_settings: Settings,
    drill_env: dict[str, str],
    drill_tenant: str,
    client: redis.Redis,
    tmp_path: Path,
) -> None:
    register_tools(search, drill_tenant)
    sent = executions(drill_tenant, 400)
    with trainer(drill_env, "drill-victim", tmp_path) as victim:
        publish(drill_settings, sent)
        # Killed while it holds a batch it has read and not acknowledged.
        until(lambda: pending_of(client, EXECUTIONS, GROUP, "drill-victim") >= 8, 60, "a batch")
        killed_at = sigkill(victim)
        stranded = pending_of(client, EXECUTIONS, GROUP, "drill-victim")
        reclaimed_at = until(
            lambda: pending_of(client, EXECUTIONS, GROUP, "drill-victim") == 0, 60, "reclaim"
        )
    done, final = reconcile(search, client, drill_tenant, expected_counts(sent), 120)
    report(
        "consumer_killed_mid_batch",
        events=len(sent),
        pending_at_kill=stranded,
        reclaim_idle_ms=RECLAIM_IDLE_MS,
        time_to_reclaim_s=round(reclaimed_at - killed_at, 2),
        time_to_reconcile_s=round(done - killed_at, 2),
        counted=sum(final.values()),
    )
    assert stranded >= 8
    assert final == expected_counts(sent), "lost or double-counted executions"
    assert dead_letters_of(client, drill_tenant) == []


@pytest.mark.timeout(300)
def test_sustained_load_is_counted_exactly(
    search: search_pb2_grpc.SearchServiceStub,
    group_trainers: dict[str, ServiceProcess],
    drill_settings: Settings,
    drill_tenant: str,
    client: redis.Redis,
) -> None:
    """Thousands of executions, one in twenty published twice (an at-least-once producer),
    through the trainer group: every distinct execution is counted once."""
    register_tools(search, drill_tenant)
    distinct = executions(drill_tenant, LOAD_EVENTS)
    sent = [e for i, e in enumerate(distinct) for e in ([e, e] if i % 20 == 0 else [e])]
    started = time.monotonic()
    publish(drill_settings, sent)
    published = time.monotonic()
    done, final = reconcile(search, client, drill_tenant, expected_counts(distinct), 240)
    elapsed = done - started
    expected = sum(expected_counts(distinct).values())
    report(
        "sustained_load",
        trainers=len(group_trainers),
        entries=len(sent),
        distinct_events=len(distinct),
        publish_s=round(published - started, 2),
        handled_s=round(elapsed, 2),
        entries_per_s=round(len(sent) / elapsed),
        lost=max(0, expected - sum(final.values())),
        duplicates=max(0, sum(final.values()) - expected),
    )
    assert final == expected_counts(distinct)
    assert dead_letters_of(client, drill_tenant) == []


def _lock_owner(client: redis.Redis) -> str | None:
    """The consumer name of the trainer holding the lock (the key holds `<token>:<owner>`)."""
    value = client.get(DEFAULT_LOCK_NAME)
    return value.decode().split(":", 1)[1] if value else None


def _holder_within(client: redis.Redis, names: Collection[str], within_s: float) -> str:
    """The trainer holding the lock, waiting up to `within_s` while nobody does."""
    deadline = time.monotonic() + within_s
    while (owner := _lock_owner(client)) not in names:
        if time.monotonic() > deadline:
            pytest.fail(f"no trainer holds the lock within {within_s}s (owner: {owner})")
        time.sleep(0.05)
    assert owner is not None
    return owner


def _models_after(client: redis.Redis, tenant: str, entry_id: str) -> list[ModelPublished]:
    models = []
    for _, fields in client.xrange(Streams.MODEL_PUBLISHED, min=f"({entry_id}"):
        event = ModelPublished.model_validate_json(fields[b"data"])
        if event.tenant_id == tenant:
            models.append(event)
    return models


def _until_settled(client: redis.Redis, settings: Settings, tenant: str) -> None:
    """Every execution handled, and no version decided for a while (the tenant is trained)."""
    until(lambda: group_drained(client, EXECUTIONS, GROUP), 60, "executions handled")
    decided, still_since = None, time.monotonic()
    while time.monotonic() - still_since < 1.5:
        now = _decided(client, settings, tenant)
        if now != decided:
            decided, still_since = now, time.monotonic()
        time.sleep(0.1)


def _last_entry_id(client: redis.Redis, stream: str) -> str:
    """The id of the stream's last entry, "0" while the stream does not exist."""
    last = client.xrevrange(stream, count=1)
    return last[0][0].decode() if last else "0"


def _decided(client: redis.Redis, settings: Settings, tenant: str) -> tuple[int, str | None]:
    """How many versions were published, and the last rejected one: changes with every
    decision of the gate."""
    rejected = asyncio.run(_last_rejected(settings, tenant))
    return len(_models_after(client, tenant, "0")), rejected.version if rejected else None


@pytest.fixture
def lock_redis(tmp_path: Path) -> Iterator[ManagedProcess]:
    """A Redis of its own: the lock is per Redis, and the group's trainers must not take it."""
    proc = start_redis(tmp_path / "lock-redis")
    yield proc
    proc.stop()


@pytest.mark.timeout(240)
def test_trainer_holding_the_lock_killed_the_other_takes_over(
    lock_redis: ManagedProcess,
    drill_settings: Settings,
    drill_env: dict[str, str],
    drill_tenant: str,
    tmp_path: Path,
) -> None:
    settings = drill_settings.model_copy(update={"redis_url": lock_redis.url})
    env = {**drill_env, "PML_REDIS_URL": lock_redis.url}
    training = {
        "PML_REPLAY_MIN_TRACES": "1",
        "PML_TRAIN_STEPS": "8",
        "PML_TRAIN_BATCH_SIZE": "8",
        "PML_TRAIN_POLL_S": "0.2",
        "PML_TRAIN_QUIET_S": "0",  # what is timed is the lock's hand-over, not the batching
    }
    names = ("drill-trainer-a", "drill-trainer-b")
    with (
        redis.Redis.from_url(lock_redis.url) as client,
        trainers(env, names, tmp_path, **training) as procs,
    ):
        publish(settings, executions(drill_tenant, 40))
        # A first version decided: published, or rejected when the gate finds these executions
        # (round-robin tools, intents that say nothing) no better ranked than by the first stage.
        until(
            lambda: _tokens_after(client, settings, drill_tenant, "0", -1) != [],
            120,
            "a first version decided",
        )
        _until_settled(client, settings, drill_tenant)
        # Nothing left to train: the next holder waits for new traces holding the lock (after a
        # pass that trained, the lock is free for up to one poll interval before it is retaken).
        holder = _holder_within(client, procs, 10)
        other = next(n for n in names if n != holder)
        before = _last_entry_id(client, Streams.MODEL_PUBLISHED)
        token_before = max(_tokens_after(client, settings, drill_tenant, "0", -1))
        killed_at = sigkill(procs[holder])
        # New traces, so that the next holder has something to train on.
        publish(settings, executions(drill_tenant, 20))
        locked_at = until(lambda: _lock_owner(client) == other, 30, f"{other} takes the lock")
        # The new holder's version is published, or kept as rejected when the gate finds it
        # no better on held-back executions: either way it carries the new holder's token.
        decided_at = until(
            lambda: _tokens_after(client, settings, drill_tenant, before, token_before) != [],
            60,
            "a version decided after",
        )
        tokens = _tokens_after(client, settings, drill_tenant, before, token_before)
    report(
        "trainer_lock_takeover",
        lease_ms=LEASE_MS,
        takeover_s=round(locked_at - killed_at, 2),
        first_version_after_s=round(decided_at - killed_at, 2),
        fencing_token_before=token_before,
        fencing_token_after=tokens[0],
    )
    assert tokens[0] > token_before


def _tokens_after(
    client: redis.Redis, settings: Settings, tenant: str, entry_id: str, token_before: int
) -> list[int]:
    """Fencing tokens of the versions published after `entry_id`, or of the last rejected
    candidate when it was trained under a newer token than `token_before`."""
    tokens = [m.fencing_token for m in _models_after(client, tenant, entry_id)]
    rejected = asyncio.run(_last_rejected(settings, tenant))
    if rejected is not None and rejected.fencing_token > token_before:
        tokens.append(rejected.fencing_token)
    return tokens


async def _last_rejected(settings: Settings, tenant: str) -> ModelRecord | None:
    async with redis_client(settings) as aclient:
        found = await ModelRegistry(aclient).last_rejected(tenant)
    return found[0] if found is not None else None
