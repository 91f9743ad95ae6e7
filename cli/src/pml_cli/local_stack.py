"""The whole system on one machine: Redis, Neo4j and every service as its own process.

`pml run` keeps it in the foreground until Ctrl-C; `pml eval` starts a private one on free ports
when nothing runs; the end-to-end tests start the services against the suite's servers.
Every child runs in its own process group and is stopped with it, so nothing is left behind;
the kernel kills the children if the process that started them dies without stopping them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.console import Console

from pml_cli.phases import phase, step
from pml_common.healthcheck import check
from pml_common.local_runtime import (
    LocalRuntimeError,
    ManagedProcess,
    dies_with_parent,
    free_port,
    port_open,
    start_neo4j,
    start_redis,
    stop_all,
)
from pml_common.settings import Settings

#: service -> (python module, settings field of its port)
SERVICES: dict[str, tuple[str, str]] = {
    "search": ("pml_search", "search_port"),
    "trainer": ("pml_trainer", "trainer_port"),
    "scorer": ("pml_scorer", "scorer_port"),
    "planner": ("pml_planner", "planner_port"),
    "ingest": ("pml_ingest", "ingest_port"),
}


def settings_to_env(settings: Settings) -> dict[str, str]:
    """Environment variables that reproduce `settings` in a child process."""
    env: dict[str, str] = {}
    for name, value in settings.model_dump().items():
        if value is None or name == "consumer_name":
            continue
        if hasattr(value, "get_secret_value"):
            value = value.get_secret_value()
        env[f"PML_{name.upper()}"] = str(value)
    return env


def wait_healthy(
    address: str,
    timeout: float,
    proc: ManagedProcess | None = None,
    settings: Settings | None = None,
) -> None:
    """Block until the gRPC health service at `address` answers SERVING (over TLS when
    `settings` say so)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and not proc.alive():
            tail = proc.log_path.read_text(errors="replace")[-3000:]
            raise LocalRuntimeError(f"{proc.name} exited during start-up:\n{tail}")
        if check(address, timeout=1.0, settings=settings):
            return
        time.sleep(0.25)
    raise LocalRuntimeError(f"no healthy gRPC server at {address} after {timeout:.0f}s")


def start_service(
    name: str, settings: Settings, state_dir: Path, extra_env: Mapping[str, str] | None = None
) -> ManagedProcess:
    """Start one service as `python -m pml_<name>` and wait for its health check."""
    return _healthy(spawn_service(name, settings, state_dir, extra_env), settings)


def spawn_service(
    name: str, settings: Settings, state_dir: Path, extra_env: Mapping[str, str] | None = None
) -> ManagedProcess:
    """Start one service as `python -m pml_<name>`, without waiting for it."""
    module, port_field = SERVICES[name]
    return _spawn(name, [module], getattr(settings, port_field), settings, state_dir, extra_env)


#: Processes the services depend on: stopped last.
STORES = ("redis", "neo4j")

#: The ingestion pass workers, each its own process: `python -m pml_ingest.worker <pass>`.
INGEST_PASSES = ("chunking", "pass1", "pass2a", "pass2b", "pass3")


def start_ingest_worker(
    pass_name: str,
    settings: Settings,
    state_dir: Path,
    port: int,
    extra_env: Mapping[str, str] | None = None,
) -> ManagedProcess:
    """Start one pass worker, its health on `port`, and wait for its health check."""
    return _healthy(spawn_ingest_worker(pass_name, settings, state_dir, port, extra_env), settings)


def spawn_ingest_worker(
    pass_name: str,
    settings: Settings,
    state_dir: Path,
    port: int,
    extra_env: Mapping[str, str] | None = None,
) -> ManagedProcess:
    """Start one pass worker with its health on `port`, without waiting for it."""
    env = {"PML_INGEST_WORKER_PORT": str(port), **(extra_env or {})}
    name = f"ingest-{pass_name}"
    return _spawn(name, ["pml_ingest.worker", pass_name], port, settings, state_dir, env)


def _healthy(proc: ManagedProcess, settings: Settings) -> ManagedProcess:
    """`proc` once its health check answers; stopped if it never does or the wait is
    interrupted, so no caller is left holding a process it does not know about."""
    try:
        wait_healthy(proc.url, timeout=90, proc=proc, settings=settings)
    except BaseException:
        proc.stop()
        raise
    return proc


def _spawn(
    name: str,
    module_args: Sequence[str],
    port: int,
    settings: Settings,
    state_dir: Path,
    extra_env: Mapping[str, str] | None,
) -> ManagedProcess:
    log_path = state_dir / "logs" / f"{name}.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **settings_to_env(settings), **(extra_env or {})}
    env["PML_CONSUMER_NAME"] = f"{name}-{os.getpid()}-{time.monotonic_ns() % 100000}"
    with log_path.open("ab") as log:
        popen = subprocess.Popen(
            dies_with_parent([sys.executable, "-m", *module_args]),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    return ManagedProcess(name, popen, f"{settings.grpc_host}:{port}", log_path)


@dataclass
class LocalStack:
    """Redis, Neo4j and the services, started in order; the services stopped together, then
    the stores. `on_start` hears of every process as soon as it exists (`pml run` records it,
    so a later run finds what a killed one left)."""

    state_dir: Path
    settings: Settings
    processes: list[ManagedProcess] = field(default_factory=list)
    on_start: Callable[[ManagedProcess], None] | None = None

    @classmethod
    def on_free_ports(cls, state_dir: Path, **overrides: object) -> LocalStack:
        ports = {f: free_port() for _, f in SERVICES.values()}
        addrs = {
            f"{name}_addr": f"127.0.0.1:{ports[port_field]}"
            for name, (_, port_field) in SERVICES.items()
            if name != "trainer"
        }
        fields: dict[str, Any] = {
            "redis_url": f"redis://127.0.0.1:{free_port()}/0",
            "neo4j_uri": f"bolt://127.0.0.1:{free_port()}",
            "qdrant_path": str(state_dir / "qdrant"),
            **ports,
            **addrs,
            **overrides,
        }
        settings = Settings(**fields)
        return cls(state_dir, settings)

    def start_stores(self) -> None:
        """Start Redis and Neo4j on the ports the settings name, unless already given."""
        redis_port = _port_of(self.settings.redis_url)
        neo4j_port = _port_of(self.settings.neo4j_uri)
        for port, what in ((redis_port, "Redis"), (neo4j_port, "Neo4j")):
            if port_open(port):
                raise LocalRuntimeError(
                    f"port {port} for {what} is already in use by another program "
                    "(a PML started from another folder?)"
                )
        self._add(start_redis(self.state_dir / "redis", redis_port))
        self._add(start_neo4j(self.state_dir / "neo4j", neo4j_port))

    def start_services(self, names: Sequence[str] = tuple(SERVICES)) -> None:
        for name in names:
            _, port_field = SERVICES[name]
            port = getattr(self.settings, port_field)
            if port_open(port):
                raise LocalRuntimeError(f"port {port} for the {name} service is already in use")
            # Held before the health wait, so an interrupted start-up still stops it.
            _healthy(self._add(spawn_service(name, self.settings, self.state_dir)), self.settings)
            if name == "ingest":
                self.start_ingest_workers()

    def start_ingest_workers(self) -> None:
        """The five pass workers, each on a free health port, started together."""
        workers = [
            self._add(spawn_ingest_worker(p, self.settings, self.state_dir, free_port()))
            for p in INGEST_PASSES
        ]
        for worker in workers:
            _healthy(worker, self.settings)

    def _add(self, proc: ManagedProcess) -> ManagedProcess:
        self.processes.append(proc)
        if self.on_start is not None:
            self.on_start(proc)
        return proc

    def stop(self, hurry: Callable[[], bool] = lambda: False) -> None:
        """Services first, all at once (they may still write to the stores), then the stores;
        `hurry()` turning true kills what is left instead of waiting for it."""
        stores = [p for p in self.processes if p.name in STORES]
        stop_all([p for p in self.processes if p.name not in STORES], hurry=hurry)
        stop_all(stores, hurry=hurry)
        self.processes.clear()

    def __enter__(self) -> LocalStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


@contextmanager
def running_system(
    settings: Settings,
    console: Console,
    services: Sequence[str] = ("search", "trainer"),
    private: Mapping[str, object] | None = None,
) -> Iterator[Settings]:
    """The settings of a reachable system: the running one, or a private one started here.

    `services` are those the caller needs; a running system must answer on all of them.
    `private`: settings of a private system that differ from the environment's.
    """
    addresses = [getattr(settings, f"{name}_addr") for name in services if name != "trainer"]
    if all(_reachable(address, settings) for address in addresses):
        yield settings
        return
    interrupts = interrupt_on_signals()
    with tempfile.TemporaryDirectory(prefix="pml-eval-") as tmp:
        stack = LocalStack.on_free_ports(Path(tmp), **(private or {}))
        try:
            what = "no PML running: starting a private one (about a minute)"
            with phase(console, what) as status:
                stack.on_start = lambda p: status.update(f"{what}: {p.name}…")
                stack.start_stores()
                stack.start_services(list(dict.fromkeys(["search", "trainer", *services])))
            step(console, "private PML ready")
            yield stack.settings
        finally:
            interrupts.stop_now()
            with phase(console, "stopping the private PML"):
                stack.stop(interrupts.hurry)
            step(console, "private PML stopped")


#: Signals closer together than this are one interrupt: a terminal's Ctrl-C reaches make, uv
#: and pml at once, and make and uv each pass theirs on to pml a moment later.
ECHO_S = 1.0


class Interrupts:
    """How SIGINT, SIGTERM and SIGHUP (the terminal closed) stop the system, however many of
    them arrive.

    The first raises KeyboardInterrupt in the main thread, so the `finally` that stops the
    system runs whatever ended the command (Ctrl-C, a kill, a CI timeout). Once stopping, a
    signal never interrupts the stop sequence: it is noted, and one arriving `ECHO_S` after the
    first (a second Ctrl-C, not an echo of the first) makes `hurry()` true, which kills what is
    left instead of waiting for it. Installed explicitly for SIGINT too, as a shell may start
    background jobs with SIGINT ignored."""

    def __init__(self) -> None:
        self.stopping = False
        self.noted = 0
        self._first: float | None = None
        self._hurried = False

    def install(self) -> Interrupts:
        if threading.current_thread() is threading.main_thread():  # Python's rule
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                signal.signal(sig, self._handle)
        return self

    def stop_now(self) -> None:
        """The stop sequence begins (for a reason other than a signal): signals are noted."""
        self.stopping = True

    def hurry(self) -> bool:
        return self._hurried

    def _handle(self, signum: int, frame: object) -> None:
        now = time.monotonic()
        if not self.stopping:
            self.stopping = True
            self._first = now
            raise KeyboardInterrupt
        self.noted += 1
        if self._first is None:
            self._first = now
        elif now - self._first >= ECHO_S:
            self._hurried = True


def interrupt_on_signals() -> Interrupts:
    """Install an `Interrupts` for this command (see there)."""
    return Interrupts().install()


def _reachable(address: str, settings: Settings) -> bool:
    try:
        wait_healthy(address, timeout=2, settings=settings)
    except LocalRuntimeError:
        return False
    return True
