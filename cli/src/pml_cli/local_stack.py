"""The whole system on one machine: Redis, Neo4j and every service as its own process.

`pml run` keeps it in the foreground until Ctrl-C; `pml eval` starts a private one on free ports
when nothing runs; the end-to-end tests start the services against the suite's servers.
Every child runs in its own process group and is stopped with it, so nothing is left behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from pml_common.healthcheck import check
from pml_common.local_runtime import (
    LocalRuntimeError,
    ManagedProcess,
    free_port,
    port_open,
    start_neo4j,
    start_redis,
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
    module, port_field = SERVICES[name]
    return _spawn(name, [module], getattr(settings, port_field), settings, state_dir, extra_env)


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
    env = {"PML_INGEST_WORKER_PORT": str(port), **(extra_env or {})}
    name = f"ingest-{pass_name}"
    return _spawn(name, ["pml_ingest.worker", pass_name], port, settings, state_dir, env)


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
            [sys.executable, "-m", *module_args],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=env,
            start_new_session=True,
        )
    proc = ManagedProcess(name, popen, f"{settings.grpc_host}:{port}", log_path)
    wait_healthy(proc.url, timeout=90, proc=proc, settings=settings)
    return proc


@dataclass
class LocalStack:
    """Redis, Neo4j and the services, started in order and stopped in reverse."""

    state_dir: Path
    settings: Settings
    processes: list[ManagedProcess] = field(default_factory=list)

    @classmethod
    def on_free_ports(cls, state_dir: Path, **overrides: object) -> LocalStack:
        ports = {f: free_port() for _, f in SERVICES.values()}
        addrs = {
            f"{name}_addr": f"127.0.0.1:{ports[port_field]}"
            for name, (_, port_field) in SERVICES.items()
            if name != "trainer"
        }
        settings = Settings(
            redis_url=f"redis://127.0.0.1:{free_port()}/0",
            neo4j_uri=f"bolt://127.0.0.1:{free_port()}",
            qdrant_path=str(state_dir / "qdrant"),
            **ports,  # type: ignore[arg-type]
            **addrs,
            **overrides,
        )
        return cls(state_dir, settings)

    def start_stores(self) -> None:
        """Start Redis and Neo4j on the ports the settings name, unless already given."""
        redis_port = _port_of(self.settings.redis_url)
        neo4j_port = _port_of(self.settings.neo4j_uri)
        for port, what in ((redis_port, "Redis"), (neo4j_port, "Neo4j")):
            if port_open(port):
                raise LocalRuntimeError(f"port {port} for {what} is already in use")
        self.processes.append(start_redis(self.state_dir / "redis", redis_port))
        self.processes.append(start_neo4j(self.state_dir / "neo4j", neo4j_port))

    def start_services(self, names: Sequence[str] = tuple(SERVICES)) -> None:
        for name in names:
            _, port_field = SERVICES[name]
            port = getattr(self.settings, port_field)
            if port_open(port):
                raise LocalRuntimeError(f"port {port} for the {name} service is already in use")
            self.processes.append(start_service(name, self.settings, self.state_dir))
            if name == "ingest":
                self.start_ingest_workers()

    def start_ingest_workers(self) -> None:
        """The five pass workers, each on a free health port."""
        for pass_name in INGEST_PASSES:
            worker = start_ingest_worker(pass_name, self.settings, self.state_dir, free_port())
            self.processes.append(worker)

    def stop(self) -> None:
        for proc in reversed(self.processes):
            proc.stop()
        self.processes.clear()

    def __enter__(self) -> LocalStack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


@contextmanager
def running_system(
    settings: Settings, console: Console, services: Sequence[str] = ("search", "trainer")
) -> Iterator[Settings]:
    """The settings of a reachable system: the running one, or a private one started here.

    `services` are those the caller needs; a running system must answer on all of them.
    """
    addresses = [getattr(settings, f"{name}_addr") for name in services if name != "trainer"]
    if all(_reachable(address, settings) for address in addresses):
        yield settings
        return
    interrupt_on_signals()
    with tempfile.TemporaryDirectory(prefix="pml-eval-") as tmp:
        stack = LocalStack.on_free_ports(Path(tmp))
        try:
            with console.status("no PML running: starting a private one (about a minute)…"):
                stack.start_stores()
                stack.start_services(list(dict.fromkeys(["search", "trainer", *services])))
            yield stack.settings
        finally:
            stack.stop()


def interrupt_on_signals() -> None:
    """SIGINT and SIGTERM raise KeyboardInterrupt, so the `finally` that stops a private system
    runs whatever ended the command (a kill, a CI timeout, Ctrl-C). Explicit for SIGINT too, as
    a shell may start background jobs with SIGINT ignored. Main thread only (Python's rule)."""
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, _interrupt)


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _reachable(address: str, settings: Settings) -> bool:
    try:
        wait_healthy(address, timeout=2, settings=settings)
    except LocalRuntimeError:
        return False
    return True
