"""`pml bench soak`: mixed load on a private system while faults are injected, then checks.

A private system is started on free ports (Redis, Neo4j, search, two trainer replicas, ingest and
its five pass workers, each its own process, with the settings' defaults) and a synthetic catalog
is registered. For `--minutes`, paced clients then send:

- `Search` from `--clients` gRPC clients, `--search-rate` calls per second in all, over queries
  whose embeddings were cached by a warm-up;
- `ExecutionCompleted` events on the stream, `--event-rate` per second, as an at-least-once
  producer would: one in `DUPLICATE_EVERY` is published twice with the same event id, and a
  publish that fails (Redis away) is retried with the same event until Redis takes it;
- `RegisterTools` of two new tools every `REGISTER_EVERY_S` seconds;
- one document `Submit`ted to ingest every `DOCUMENT_EVERY_S` seconds.

At fixed shares of the run (`FAULTS`), one after the other, each once the previous has recovered:
the trainer consumer holding the most pending executions is SIGKILLed (and a replacement started,
as an orchestrator would); Redis is restarted with its data (SHUTDOWN SAVE, then started again on
the same port and folder, as a Redis with persistence restarts); Neo4j is stopped, left down for
`NEO4J_DOWN_S`, and started again. A fault's window runs from its injection until it has
recovered: the component serves again (for the killed consumer: its replacement is healthy and
its pending entries were reclaimed), a `Search` started after that succeeded, and the trainer
group acknowledged executions after that (the backlog the fault left is then being worked off,
which `drain_s` and the handled rate show). Figures are split between those windows and the
rest.

Once the load stops, the soak waits until every consumer group it fed is drained, then checks:
every execution published is recorded as applied by the trainer (its `AppliedEvent` ledger in
Neo4j) and counted exactly once (each event adds one execution to exactly one of the
`EXECUTED_TOOLS` first-step tools, so a tool's count above the events applied to it is an effect
counted twice); every registration answered OK has its tools in the graph; every document
accepted went through all five passes.
"""

from __future__ import annotations

import asyncio
import itertools
import random
import statistics
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import neo4j
import redis
from redis.exceptions import RedisError
from rich.console import Console

from pml.v1 import ingest_pb2, search_pb2
from pml_cli import client, ingest_client
from pml_cli.bench_search import (
    OBJECTS,
    PLACES,
    QUERIES,
    VERBS,
    synthetic_catalog,
    synthetic_queries,
)
from pml_cli.local_stack import (
    INGEST_PASSES,
    LocalStack,
    interrupt_on_signals,
    start_service,
)
from pml_cli.phases import counted_phase, phase, step
from pml_common.bus import EventBus
from pml_common.events import ExecutionCompleted, ExecutionStep, Streams, ToolSpec
from pml_common.local_runtime import ManagedProcess, free_port, restart, stop_all
from pml_common.settings import Settings
from pml_common.stores import neo4j_auth
from pml_trainer.graph_store import GROUP as TRAINER_GROUP

TENANT = "soak"
#: Fault, and the share of the run at which it is due.
FAULTS = (("consumer_sigkilled", 0.2), ("redis_restarted", 0.45), ("neo4j_stopped", 0.7))
NEO4J_DOWN_S = 10.0
CATALOG_TOOLS = 200
#: Executions go first through one of these catalog tools, then through one of as many others.
EXECUTED_TOOLS = 16
DUPLICATE_EVERY = 20
REGISTER_EVERY_S = 2.0
DOCUMENT_EVERY_S = 5.0
SEARCH_TIMEOUT_S = 10.0
WRITE_TIMEOUT_S = 30.0
PUBLISH_RETRY_S = 0.2
SAMPLE_S = 1.0
RECOVERY_TIMEOUT_S = 600.0
DRAIN_TIMEOUT_S = 900.0
POLL_S = 0.5
#: Stream and consumer group of each ingestion pass (pml_ingest.passes: group `ingest-<pass>`).
PASS_STREAMS = dict(
    zip(
        INGEST_PASSES,
        (
            Streams.DOCUMENT_SUBMITTED,
            Streams.CHUNKING_COMPLETED,
            Streams.PASS1_COMPLETED,
            Streams.PASS2A_COMPLETED,
            Streams.PASS2B_COMPLETED,
        ),
        strict=True,
    )
)
#: (stream, group) pairs the load feeds: drained means every event the soak caused was handled.
DRAINED_GROUPS = (
    (Streams.EXECUTION_COMPLETED, TRAINER_GROUP),
    (Streams.TOOLS_REGISTERED, TRAINER_GROUP),
    *((stream, f"ingest-{name}") for name, stream in PASS_STREAMS.items()),
)


@dataclass(frozen=True)
class SoakPlan:
    minutes: float
    clients: int
    search_rate: float
    event_rate: float

    @property
    def duration_s(self) -> float:
        return self.minutes * 60.0


# --- what the load records ------------------------------------------------------------------


@dataclass
class Calls:
    """Every gRPC call of the load (method, start, ms, error code or None) and publish errors;
    written by the load threads."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    rows: list[tuple[str, float, float, str | None]] = field(default_factory=list)
    publish_errors: Counter[str] = field(default_factory=Counter)

    def record(self, method: str, started: float, ms: float, code: str | None) -> None:
        with self.lock:
            self.rows.append((method, started, ms, code))

    def publish_failed(self, error: str) -> None:
        with self.lock:
            self.publish_errors[error] += 1

    def search_ok_since(self, since: float) -> bool:
        with self.lock:
            return any(m == "Search" and s >= since and c is None for m, s, _, c in self.rows)


@dataclass
class Ledger:
    """What the system accepted: executions published (event id -> first publish acknowledged,
    first-step tool), registrations and documents answered OK."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    executions: dict[str, tuple[float, str]] = field(default_factory=dict)
    duplicate_entries: int = 0
    registrations: list[list[str]] = field(default_factory=list)
    documents: list[str] = field(default_factory=list)

    def published(self, event: ExecutionCompleted, at: float) -> None:
        with self.lock:
            self.executions.setdefault(event.event_id, (at, event.steps[0].node_id))


@dataclass
class Handled:
    """(time, entries the trainer group has acknowledged), sampled every `SAMPLE_S`."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    samples: list[tuple[float, int]] = field(default_factory=list)

    def add(self, at: float, acknowledged: int) -> None:
        with self.lock:
            self.samples.append((at, acknowledged))

    def rising_since(self, since: float) -> bool:
        """The group acknowledged entries after `since`: executions are handled again."""
        with self.lock:
            after = [count for at, count in self.samples if at >= since]
        return len(after) > 1 and after[-1] > after[0]


@dataclass
class Observed:
    """What the load threads record, read by the faults' recovery checks and the report."""

    calls: Calls = field(default_factory=Calls)
    ledger: Ledger = field(default_factory=Ledger)
    handled: Handled = field(default_factory=Handled)


@dataclass
class Fault:
    name: str
    injected: float
    back: float | None = None
    recovered: float | None = None
    detail: dict[str, Any] = field(default_factory=dict)


# --- the private system ---------------------------------------------------------------------


class Graph:
    """Reads of the trainer's graph for the checks (the soak's own driver, which reconnects
    by itself after Neo4j restarts)."""

    def __init__(self, settings: Settings) -> None:
        self._database = settings.neo4j_database
        self._driver = neo4j.GraphDatabase.driver(
            settings.neo4j_uri, auth=neo4j_auth(settings), connection_timeout=2.0
        )

    def close(self) -> None:
        self._driver.close()

    def applied(self, ids: Sequence[str]) -> set[str]:
        records, _, _ = self._driver.execute_query(
            "MATCH (a:AppliedEvent {tenant_id: $tenant, group: $group}) "
            "WHERE a.event_id IN $ids RETURN a.event_id AS id",
            tenant=TENANT,
            group=TRAINER_GROUP,
            ids=list(ids),
            database_=self._database,
        )
        return {r["id"] for r in records}

    def executions(self, tool_ids: Sequence[str]) -> dict[str, int]:
        """The execution count of each of `tool_ids` that is in the graph."""
        records, _, _ = self._driver.execute_query(
            "MATCH (t:Tool {tenant_id: $tenant}) WHERE t.id IN $ids "
            "RETURN t.id AS id, t.executions AS executions",
            tenant=TENANT,
            ids=list(tool_ids),
            database_=self._database,
        )
        return {r["id"]: int(r["executions"] or 0) for r in records}


@dataclass
class System:
    stack: LocalStack
    trainers: list[ManagedProcess]

    @property
    def settings(self) -> Settings:
        return self.stack.settings

    def process(self, name: str) -> ManagedProcess:
        return next(p for p in self.stack.processes if p.name == name and p.alive())

    def replace(self, old: ManagedProcess, new: ManagedProcess) -> None:
        self.stack.processes[self.stack.processes.index(old)] = new

    def add_trainer(self) -> ManagedProcess:
        """A trainer replica with its own health port (the group is shared)."""
        settings = self.settings.model_copy(update={"trainer_port": free_port()})
        proc = start_service("trainer", settings, self.stack.state_dir)
        self.stack.processes.append(proc)
        self.trainers.append(proc)
        return proc

    def redis(self) -> redis.Redis:
        return redis.Redis.from_url(
            self.settings.redis_url, decode_responses=True, socket_timeout=2
        )


def _start(stack: LocalStack, console: Console) -> System:
    what = "set-up: starting Redis, Neo4j, search, two trainers, ingest and its pass workers"
    with phase(console, what) as status:
        stack.on_start = lambda p: status.update(f"{what}: {p.name}…")
        stack.start_stores()
        stack.start_services(["search", "trainer", "ingest"])
        system = System(stack, [p for p in stack.processes if p.name == "trainer"])
        system.add_trainer()
    return system


def _prepare(
    system: System, catalog: Sequence[ToolSpec], queries: Sequence[str], console: Console
) -> None:
    with phase(console, f"set-up: registering {len(catalog)} catalog tools"):
        client.register_tools(system.settings, TENANT, catalog)
        _wait(
            lambda: _drained(system, [(Streams.TOOLS_REGISTERED, TRAINER_GROUP)]),
            300,
            "the catalog",
        )
    stub = client.search_stub(system.settings)
    what = f"set-up: warm-up, {len(queries)} searches fill the embedding cache (not counted)"
    with counted_phase(console, what, len(queries)) as bar:
        for query in queries:
            stub.Search(
                search_pb2.SearchRequest(tenant_id=TENANT, query=query, limit=10), timeout=60
            )
            bar.advance()


def _wait(condition: Callable[[], bool], timeout: float, what: str) -> float:
    """Poll until `condition()` holds (errors count as not yet); the monotonic time it did."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return time.monotonic()
        except (RedisError, OSError, neo4j.exceptions.Neo4jError, neo4j.exceptions.DriverError):
            pass
        time.sleep(POLL_S)
    raise TimeoutError(f"{what}: not reached within {timeout:.0f}s")


def _group(client_: redis.Redis, stream: str, group: str) -> dict[str, Any] | None:
    for info in client_.xinfo_groups(stream):
        if info["name"] == group:
            return dict(info)
    return None


def _drained(system: System, pairs: Sequence[tuple[str, str]]) -> bool:
    with system.redis() as r:
        for stream, group in pairs:
            info = _group(r, stream, group)
            if info is None or int(info["pending"]) or int(info.get("lag") or 0):
                return False
    return True


# --- the load -------------------------------------------------------------------------------


def _paced(stop: threading.Event, interval: float, action: Callable[[], None]) -> None:
    """`action` every `interval` seconds until `stop`; a late call is not made up for with a
    burst (a client held back by a fault carries on at its pace)."""
    next_at = time.monotonic()
    while not stop.is_set():
        action()
        next_at = max(next_at + interval, time.monotonic())
        stop.wait(max(0.0, next_at - time.monotonic()))


def _timed(calls: Calls, method: str, call: Callable[[], Any]) -> Any:
    """`call()`'s reply, None when it failed; recorded either way."""
    started = time.monotonic()
    try:
        reply = call()
    except grpc.RpcError as exc:
        calls.record(method, started, (time.monotonic() - started) * 1000, exc.code().name)
        return None
    calls.record(method, started, (time.monotonic() - started) * 1000, None)
    return reply


def _searcher(
    system: System, queries: Sequence[str], offset: int, seen: Observed
) -> Callable[[], None]:
    stub = client.search_stub(system.settings)
    cycle = itertools.islice(itertools.cycle(queries), offset, None)

    def search() -> None:
        request = search_pb2.SearchRequest(tenant_id=TENANT, query=next(cycle), limit=10)
        _timed(seen.calls, "Search", lambda: stub.Search(request, timeout=SEARCH_TIMEOUT_S))

    return search


def _registrar(system: System, seen: Observed) -> Callable[[], None]:
    stub = client.search_stub(system.settings)
    numbers = itertools.count()

    def register() -> None:
        n = next(numbers)
        tools = [_new_tool(n, k) for k in range(2)]
        request = search_pb2.RegisterToolsRequest(
            tenant_id=TENANT, tools=[client.tool_message(t) for t in tools]
        )
        call = lambda: stub.RegisterTools(request, timeout=WRITE_TIMEOUT_S)  # noqa: E731
        if _timed(seen.calls, "RegisterTools", call) is not None:
            with seen.ledger.lock:
                seen.ledger.registrations.append([t.id for t in tools])

    return register


def _new_tool(n: int, k: int) -> ToolSpec:
    verb, obj, place = VERBS[n % len(VERBS)], OBJECTS[(n + k) % len(OBJECTS)], PLACES[k]
    name = f"{verb}_{obj.replace(' ', '_')}_{n}_{k}"
    description = f"{verb.capitalize()} a {obj} {place}."
    return ToolSpec(id=f"soak-new:{name}", server="soak-new", name=name, description=description)


def _submitter(system: System, seen: Observed) -> Callable[[], None]:
    stub = ingest_client.ingest_stub(system.settings)
    numbers = itertools.count()

    def submit() -> None:
        doc = _document(next(numbers))
        request = ingest_pb2.SubmitRequest(tenant_id=TENANT, documents=[doc])
        call = lambda: stub.Submit(request, timeout=WRITE_TIMEOUT_S)  # noqa: E731
        if _timed(seen.calls, "Submit", call) is not None:
            with seen.ledger.lock:
                seen.ledger.documents.append(doc.id)

    return submit


def _document(n: int) -> ingest_pb2.Document:
    rng = random.Random(n)
    sections = []
    for _ in range(3):
        verb, obj, other = rng.choice(VERBS), rng.choice(OBJECTS), rng.choice(OBJECTS)
        sections.append(
            f"## {verb.capitalize()} the {obj}\n\nTo {verb} a {obj} {rng.choice(PLACES)}, the "
            f"operator opens the {obj} console and checks the {other} first. The {obj} team "
            f"owns this procedure and reviews every {other} it touches."
        )
    text = f"# Runbook {n}\n\n" + "\n\n".join(sections)
    return ingest_pb2.Document(
        id=f"soak-doc-{n}", title=f"Runbook {n}", text=text, format="markdown"
    )


def _execution(
    n: int, first: Sequence[str], then: Sequence[str], intents: Sequence[str]
) -> ExecutionCompleted:
    a, b = first[n % len(first)], then[(n // len(first)) % len(then)]
    ok = n % 7 != 0
    event: ExecutionCompleted = ExecutionCompleted.create(
        tenant_id=TENANT,
        intent=intents[n % len(intents)],
        steps=[
            ExecutionStep(node_id=a, success=True),
            ExecutionStep(node_id=b, success=ok, depends_on=[a]),
        ],
        outcome="success" if ok else "failure",
    )
    return event


async def _publish(
    bus: EventBus, event: ExecutionCompleted, calls: Calls, stop: threading.Event
) -> bool:
    """Publish until Redis takes it (an at-least-once producer); False when the load stopped
    first, the event then never published."""
    while True:
        try:
            await bus.publish(event)
            return True
        except (RedisError, OSError) as exc:
            calls.publish_failed(type(exc).__name__)
            if stop.is_set():
                return False
            await asyncio.sleep(PUBLISH_RETRY_S)


async def _produce(
    system: System,
    catalog: Sequence[ToolSpec],
    intents: Sequence[str],
    rate: float,
    seen: Observed,
    stop: threading.Event,
) -> None:
    """Executions at `rate` per second, one in `DUPLICATE_EVERY` published twice."""
    first = [t.id for t in catalog[:EXECUTED_TOOLS]]
    then = [t.id for t in catalog[EXECUTED_TOOLS : 2 * EXECUTED_TOOLS]]
    next_at = time.monotonic()
    async with EventBus(system.settings, "soak-producer") as bus:
        for n in itertools.count():
            event = _execution(n, first, then, intents)
            if stop.is_set() or not await _publish(bus, event, seen.calls, stop):
                return
            seen.ledger.published(event, time.monotonic())
            if n % DUPLICATE_EVERY == 0 and await _publish(bus, event, seen.calls, stop):
                with seen.ledger.lock:
                    seen.ledger.duplicate_entries += 1
            next_at = max(next_at + 1.0 / rate, time.monotonic())
            await asyncio.sleep(next_at - time.monotonic())


def _sample_handled(system: System, handled: Handled, stop: threading.Event) -> None:
    with system.redis() as r:
        while not stop.wait(SAMPLE_S):
            try:
                info = _group(r, Streams.EXECUTION_COMPLETED, TRAINER_GROUP)
            except (RedisError, OSError):
                continue  # Redis restarting: the next sample covers the gap
            if info is not None and info.get("entries-read") is not None:
                handled.add(time.monotonic(), int(info["entries-read"]) - int(info["pending"]))


@dataclass
class Load:
    """The load threads; a thread that dies of an unexpected error is reported when joined."""

    stop: threading.Event = field(default_factory=threading.Event)
    threads: list[threading.Thread] = field(default_factory=list)
    failures: list[BaseException] = field(default_factory=list)

    def start(self, name: str, target: Callable[[], None]) -> None:
        def run() -> None:
            try:
                target()
            except BaseException as exc:
                self.failures.append(exc)

        thread = threading.Thread(target=run, name=f"soak-{name}", daemon=True)
        thread.start()
        self.threads.append(thread)

    def paced(self, name: str, interval: float, action: Callable[[], None]) -> None:
        self.start(name, lambda: _paced(self.stop, interval, action))

    def join(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(WRITE_TIMEOUT_S + 10)
        if self.failures:
            raise RuntimeError(f"a load thread failed: {self.failures[0]!r}") from self.failures[0]


def _start_load(
    system: System,
    plan: SoakPlan,
    catalog: Sequence[ToolSpec],
    queries: Sequence[str],
    seen: Observed,
) -> Load:
    load = Load()
    for i in range(plan.clients):
        offset = i * len(queries) // plan.clients  # the clients do not ask the same in step
        search = _searcher(system, queries, offset, seen)
        load.paced(f"search-{i}", plan.clients / plan.search_rate, search)
    load.paced("registrar", REGISTER_EVERY_S, _registrar(system, seen))
    load.paced("submitter", DOCUMENT_EVERY_S, _submitter(system, seen))
    produce = _produce(system, catalog, queries, plan.event_rate, seen, load.stop)
    load.start("producer", lambda: asyncio.run(produce))
    load.start("sampler", lambda: _sample_handled(system, seen.handled, load.stop))
    return load


# --- the faults -----------------------------------------------------------------------------


def _consumer_name(proc: ManagedProcess) -> str:
    """The consumer name a service process was started with (`local_stack` draws it)."""
    environ = Path(f"/proc/{proc.pid}/environ").read_bytes().split(b"\0")
    found = next(v for v in environ if v.startswith(b"PML_CONSUMER_NAME="))
    return found.split(b"=", 1)[1].decode()


def _pending_by_consumer(system: System) -> dict[str, int]:
    with system.redis() as r:
        rows = r.xinfo_consumers(Streams.EXECUTION_COMPLETED, TRAINER_GROUP)
    return {row["name"]: int(row["pending"]) for row in rows}


def _kill_consumer(system: System, fault: Fault, console: Console) -> None:
    pending = _pending_by_consumer(system)
    names = {_consumer_name(p): p for p in system.trainers}
    victim = max(names, key=lambda name: pending.get(name, 0))
    names[victim].kill()
    system.trainers.remove(names[victim])
    fault.detail["pending_at_kill"] = pending.get(victim, 0)
    with phase(
        console, "recovery: starting a replacement trainer, the others reclaim the victim's entries"
    ):
        started = time.monotonic()
        system.add_trainer()
        fault.detail["replacement_start_s"] = round(time.monotonic() - started, 2)
        _wait(
            lambda: _pending_by_consumer(system).get(victim, 0) == 0, RECOVERY_TIMEOUT_S, "reclaim"
        )


def _restart_redis(system: System, fault: Fault, console: Console) -> None:
    old = system.process("redis")
    with system.redis() as r:
        r.shutdown(save=True)  # what a Redis with persistence keeps across a restart
    old.process.wait(60)
    with phase(console, "recovery: starting Redis again on its port and data folder"):
        system.replace(old, restart(old))
    with system.redis() as r:
        fault.detail["keys_after_restart"] = int(r.dbsize())


def _stop_neo4j(system: System, fault: Fault, console: Console) -> None:
    old = system.process("neo4j")
    old.stop()
    with phase(console, f"fault: Neo4j down for {NEO4J_DOWN_S:.0f}s"):
        time.sleep(NEO4J_DOWN_S)
    with phase(console, "recovery: starting Neo4j again on its port and data folder"):
        started = time.monotonic()
        system.replace(old, restart(old))
        fault.detail["neo4j_start_s"] = round(time.monotonic() - started, 2)


INJECT: dict[str, tuple[str, Callable[[System, Fault, Console], None]]] = {
    "consumer_sigkilled": (
        "SIGKILL to the trainer consumer holding the most entries",
        _kill_consumer,
    ),
    "redis_restarted": ("Redis shut down (its data saved) and restarted", _restart_redis),
    "neo4j_stopped": ("Neo4j stopped", _stop_neo4j),
}


def _inject(system: System, name: str, seen: Observed, console: Console) -> Fault:
    what, inject = INJECT[name]
    fault = Fault(name, time.monotonic())
    step(console, f"fault: {what}")
    inject(system, fault, console)
    back = fault.back = time.monotonic()
    try:
        with phase(console, "recovery: waiting for searches to succeed and executions to flow"):
            fault.recovered = _wait(
                lambda: seen.calls.search_ok_since(back) and seen.handled.rising_since(back),
                RECOVERY_TIMEOUT_S,
                f"recovery from {name}",
            )
    except TimeoutError as exc:
        step(console, f"recovery: {exc}")
    else:
        step(console, f"recovery: {name} recovered {fault.recovered - fault.injected:.1f}s after")
    return fault


def _steady(console: Console, until: float, what: str) -> None:
    """Load alone until `until` (monotonic), a bar of seconds."""
    seconds = until - time.monotonic()
    if seconds <= 0:
        return
    with counted_phase(console, what, round(seconds)) as bar:
        begun = time.monotonic()
        while time.monotonic() < until:
            time.sleep(min(POLL_S, max(0.0, until - time.monotonic())))
            bar.reach(min(round(seconds), round(time.monotonic() - begun)))


def _run(
    system: System, plan: SoakPlan, load_start: float, seen: Observed, console: Console
) -> list[Fault]:
    faults: list[Fault] = []
    for name, share in FAULTS:
        due = load_start + share * plan.duration_s
        _steady(
            console, due, f"load: mixed load until {name} (due at {share * plan.duration_s:.0f}s)"
        )
        faults.append(_inject(system, name, seen, console))
    end = load_start + plan.duration_s
    _steady(console, end, f"load: mixed load until the end ({plan.duration_s:.0f}s)")
    return faults


# --- after the load -------------------------------------------------------------------------


def _drain(system: System, ledger: Ledger, console: Console) -> tuple[float, bool]:
    """Wait until every group the load fed is drained: the seconds it took, and whether it
    was before `DRAIN_TIMEOUT_S` (if not, what is still queued counts as lost)."""
    started = time.monotonic()
    graph = Graph(system.settings)
    ids = list(ledger.executions)
    try:
        with counted_phase(console, "drain: executions applied / published", len(ids)) as bar:

            def done() -> bool:
                bar.reach(len(graph.applied(ids)))
                return _drained(system, DRAINED_GROUPS)

            _wait(done, DRAIN_TIMEOUT_S, "every consumer group drained")
    except TimeoutError as exc:
        step(console, f"drain: {exc}")
        return time.monotonic() - started, False
    finally:
        graph.close()
    return time.monotonic() - started, True


def _checks(system: System, ledger: Ledger) -> dict[str, Any]:
    graph = Graph(system.settings)
    try:
        applied = graph.applied(list(ledger.executions))
        expected = Counter(tool for i, (_, tool) in ledger.executions.items() if i in applied)
        counted = graph.executions(sorted({tool for _, tool in ledger.executions.values()}))
        registered = ledger.registrations
        present = set(graph.executions([i for ids in registered for i in ids]))
    finally:
        graph.close()
    documents = _documents_done(system, ledger.documents)
    doubles = sum(max(0, counted.get(t, 0) - n) for t, n in expected.items())
    uncounted = sum(max(0, n - counted.get(t, 0)) for t, n in expected.items())
    lost = {
        "executions": len(ledger.executions) - len(applied) + uncounted,
        "registrations": sum(1 for ids in registered if not set(ids) <= present),
        "documents": len(ledger.documents) - documents,
    }
    return {
        "events": {
            "executions_published": len(ledger.executions),
            "duplicate_entries": ledger.duplicate_entries,
            "executions_applied": len(applied),
            "registrations_ok": len(registered),
            "documents_accepted": len(ledger.documents),
            "documents_done": documents,
            "redelivered_already_applied": _already_applied(system),
            "dead_letters": _dead_letters(system),
        },
        "lost": {**lost, "total": sum(lost.values())},
        "double_effects": doubles,
    }


def _documents_done(system: System, ids: Sequence[str]) -> int:
    if not ids:
        return 0
    found = ingest_client.statuses(system.settings, TENANT, ids)
    return sum(1 for s in found if ingest_client.state_of(s) == "done")


def _already_applied(system: System) -> int:
    """Executions handed to a trainer again after one had applied them (the killed consumer's
    batch), turned away by their `AppliedEvent` record: the guard against double effects at
    work, as the trainers log it."""
    log = system.stack.state_dir / "logs" / "trainer.log"
    return sum(
        1
        for line in log.read_text(errors="replace").splitlines()
        if "trainer.event_already_applied" in line and '"ExecutionCompleted"' in line
    )


def _dead_letters(system: System) -> dict[str, int]:
    """Dead letters by stream/group (the private system has no other tenant)."""
    with system.redis() as r:
        rows = r.xrange(Streams.DEAD_LETTER)
    return dict(Counter(f"{f.get('stream')}/{f.get('group')}" for _, f in rows))


# --- the report -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Windows:
    """The fault windows within the load, [injected, recovered) in monotonic seconds."""

    start: float
    end: float
    spans: tuple[tuple[float, float], ...]

    @classmethod
    def of(cls, faults: Sequence[Fault], start: float, end: float) -> Windows:
        return cls(start, end, tuple((f.injected, min(f.recovered or end, end)) for f in faults))

    def during(self, at: float) -> bool:
        return any(a <= at < b for a, b in self.spans)

    @property
    def during_s(self) -> float:
        return sum(b - a for a, b in self.spans)

    @property
    def outside_s(self) -> float:
        return self.end - self.start - self.during_s


def _latency(values: Sequence[float]) -> dict[str, Any]:
    if len(values) < 2:
        return {"count": len(values), "p50_ms": None, "p99_ms": None}
    p99 = statistics.quantiles(values, n=100, method="inclusive")[98]
    return {
        "count": len(values),
        "p50_ms": round(statistics.median(values), 2),
        "p99_ms": round(p99, 2),
    }


def _split(windows: Windows, times: Sequence[float]) -> dict[str, float]:
    """Per-second rates of events at `times`, outside and during the fault windows."""
    during = sum(1 for t in times if windows.during(t))
    return {
        "outside_faults": round((len(times) - during) / max(windows.outside_s, 1e-9), 2),
        "during_faults": round(during / max(windows.during_s, 1e-9), 2),
    }


def _handled(windows: Windows, handled: Handled) -> dict[str, float]:
    """Handled entries/s from the trainer group's samples, each increase placed at the middle
    of its interval."""
    increases: list[float] = []
    for (t0, c0), (t1, c1) in itertools.pairwise(handled.samples):
        increases.extend([(t0 + t1) / 2] * max(0, c1 - c0))
    return _split(windows, increases)


def _report(
    plan: SoakPlan,
    windows: Windows,
    faults: Sequence[Fault],
    seen: Observed,
    drain: tuple[float, bool],
    checks: dict[str, Any],
) -> dict[str, Any]:
    calls = seen.calls
    ok = [(m, s, ms) for m, s, ms, c in calls.rows if c is None]
    searches = [(s, ms) for m, s, ms in ok if m == "Search"]
    errors: dict[str, Counter[str]] = {}
    for method, _, _, code in calls.rows:
        if code is not None:
            errors.setdefault(method, Counter())[code] += 1
    if calls.publish_errors:
        errors["publish"] = calls.publish_errors
    offered_requests = plan.search_rate + 1 / REGISTER_EVERY_S + 1 / DOCUMENT_EVERY_S
    return {
        "minutes": plan.minutes,
        "load_s": round(windows.end - windows.start, 1),
        "clients": plan.clients,
        "requests": dict(Counter(m for m, _, _, _ in calls.rows)),
        "requests_per_s": {
            "offered": round(offered_requests, 2),
            **_split(windows, [s for _, s, _ in ok]),
        },
        "search_ms": {
            "outside_faults": _latency([ms for s, ms in searches if not windows.during(s)]),
            "during_faults": _latency([ms for s, ms in searches if windows.during(s)]),
        },
        "events_per_s": {
            "offered": plan.event_rate,
            "published": _split(windows, [at for at, _ in seen.ledger.executions.values()]),
            "handled": _handled(windows, seen.handled),
        },
        "errors": {method: dict(codes) for method, codes in errors.items()},
        "faults": [_fault_row(f, windows.start) for f in faults],
        "drain_s": round(drain[0], 1),
        "drained": drain[1],
        **checks,
        "passed": drain[1] and checks["lost"]["total"] == 0 and checks["double_effects"] == 0,
    }


def _fault_row(fault: Fault, start: float) -> dict[str, Any]:
    def after(at: float | None) -> float | None:
        return None if at is None else round(at - fault.injected, 2)

    return {
        "fault": fault.name,
        "at_s": round(fault.injected - start, 1),
        "back_after_s": after(fault.back),
        "recovered_after_s": after(fault.recovered),
        **fault.detail,
    }


# --- the command ----------------------------------------------------------------------------


def bench_soak(plan: SoakPlan, console: Console) -> dict[str, Any]:
    catalog = synthetic_catalog(CATALOG_TOOLS)
    queries = synthetic_queries(QUERIES)
    interrupts = interrupt_on_signals()
    with tempfile.TemporaryDirectory(prefix="pml-bench-soak-") as tmp:
        stack = LocalStack.on_free_ports(Path(tmp), log_format="json")
        try:
            system = _start(stack, console)
            _prepare(system, catalog, queries, console)
            seen = Observed()
            with _loaded(system, plan, catalog, queries, seen, console) as start:
                faults = _run(system, plan, start, seen, console)
                windows = Windows.of(faults, start, time.monotonic())
            drain = _drain(system, seen.ledger, console)
            # The checks read the ledger, then the counts: a trainer still applying executions
            # in between (a drain that timed out) would show counts above the ledger's.
            with phase(console, "checks: stopping the trainers, so nothing changes under them"):
                stop_all(system.trainers)
            what = "checks: executions applied once, registrations and documents through"
            with phase(console, what):
                checks = _checks(system, seen.ledger)
        finally:
            interrupts.stop_now()
            with phase(console, "teardown: stopping the private system"):
                stack.stop(interrupts.hurry)
    return _report(plan, windows, faults, seen, drain, checks)


@contextmanager
def _loaded(
    system: System,
    plan: SoakPlan,
    catalog: Sequence[ToolSpec],
    queries: Sequence[str],
    seen: Observed,
    console: Console,
) -> Iterator[float]:
    step(
        console,
        f"load: {plan.clients} search clients ({plan.search_rate:g}/s), executions "
        f"({plan.event_rate:g}/s), registrations, documents",
    )
    load = _start_load(system, plan, catalog, queries, seen)
    try:
        yield time.monotonic()
    finally:
        with phase(console, "load: stopping the clients"):
            load.join()
