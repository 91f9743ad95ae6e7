"""Start and stop the real Redis and Neo4j servers that local runs and the test suite use.

Redis is the system's `redis-server`; Neo4j is the 5.26 LTS community jars that
`deploy/local/neo4j` resolves from Maven Central, started with Bolt on loopback. Both run as
child processes in their own process group, so stopping them leaves nothing behind; and they
die with the process that started them even when it is killed (`dies_with_parent`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[4]
NEO4J_PROJECT = REPO_ROOT / "deploy" / "local" / "neo4j"

#: Redis's eviction policy wherever PML runs it (here, docker-compose.yml, deploy/k8s): at
#: `maxmemory` only keys with a TTL are evicted (the embedding cache first of all), never a
#: stream or a key without TTL; when nothing can be evicted, writes fail instead of data being
#: lost (docs/operations.md, "Memory").
REDIS_MAXMEMORY_POLICY = "volatile-lru"
#: Memory the local Redis (`make run`, the test suite) may use.
LOCAL_REDIS_MAXMEMORY = "1gb"


class LocalRuntimeError(RuntimeError):
    """A local server could not be started; the message says what to do."""


@dataclass
class ManagedProcess:
    """A server started by PML, stopped (with its whole process group) by `stop()`."""

    name: str
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path
    workdir: Path | None = None
    _stopped: bool = field(default=False, repr=False)

    @property
    def pid(self) -> int:
        return self.process.pid

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 20.0) -> None:
        """Terminate gracefully, then kill the group if it does not exit in time."""
        stop_all([self], timeout)

    def signal_group(self, sig: signal.Signals) -> None:
        """Send `sig` to the process group (the server and anything it started)."""
        if self.alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.process.pid, sig)

    def kill(self) -> None:
        """Kill abruptly (for failure drills)."""
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(10)
        self._stopped = True


def stop_all(
    procs: Sequence[ManagedProcess],
    timeout: float = 20.0,
    hurry: Callable[[], bool] = lambda: False,
) -> None:
    """Stop `procs` together: SIGTERM to every group at once, then SIGKILL to those still
    running after `timeout` seconds, or as soon as `hurry()` turns true (a second Ctrl-C)."""
    pending = [p for p in procs if not p._stopped]
    for proc in pending:
        proc._stopped = True
        proc.signal_group(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while any(p.alive() for p in pending) and time.monotonic() < deadline and not hurry():
        time.sleep(0.1)
    for proc in pending:
        proc.signal_group(signal.SIGKILL)
    for proc in pending:
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.process.wait(10)


def dies_with_parent(argv: Sequence[str]) -> list[str]:
    """`argv` run so that the kernel kills it when this process dies, even by SIGKILL
    (PR_SET_PDEATHSIG, set by util-linux `setpriv` just before it execs `argv`).

    Only from the main thread: the kernel ties the signal to the thread that started the child,
    so a child started from a worker thread would die when that thread ends. Without setpriv
    the child runs as is (a later `pml run` still finds what a killed run left behind)."""
    setpriv = shutil.which("setpriv")
    if setpriv is None or threading.current_thread() is not threading.main_thread():
        return list(argv)
    return [setpriv, "--pdeathsig", "KILL", "--", *argv]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as sock:
        sock.settimeout(0.5)
        return sock.connect_ex((host, port)) == 0


def _wait_port(proc: ManagedProcess, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not proc.alive():
            tail = proc.log_path.read_text(errors="replace")[-2000:]
            raise LocalRuntimeError(
                f"{proc.name} exited during start-up; its log ends with:\n{tail}"
            )
        if port_open(port):
            return
        time.sleep(0.2)
    raise LocalRuntimeError(f"{proc.name} did not open port {port} within {timeout:.0f}s")


def _started(proc: ManagedProcess, port: int, timeout: float) -> ManagedProcess:
    """`proc` once it listens on `port`; stopped if it does not, or if start-up is interrupted
    (Ctrl-C), so a server nobody holds is never left behind."""
    try:
        _wait_port(proc, port, timeout)
    except BaseException:
        proc.stop()
        raise
    return proc


def _spawn(
    name: str, argv: list[str], log_path: Path, cwd: Path | None = None
) -> subprocess.Popen[bytes]:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        return subprocess.Popen(
            dies_with_parent(argv),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            cwd=cwd,
            start_new_session=True,
        )


def start_redis(
    workdir: Path,
    port: int | None = None,
    timeout: float = 20.0,
    maxmemory: str = LOCAL_REDIS_MAXMEMORY,
) -> ManagedProcess:
    """Start `redis-server` on loopback with no persistence, data under `workdir`, using at
    most `maxmemory` under `REDIS_MAXMEMORY_POLICY`."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise LocalRuntimeError(
            "redis-server is not installed: run `make deps` (apt package redis-server)"
        )
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [
        binary,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--maxmemory",
        maxmemory,
        "--maxmemory-policy",
        REDIS_MAXMEMORY_POLICY,
        "--dir",
        str(workdir),
        "--protected-mode",
        "yes",
        "--daemonize",
        "no",
    ]
    proc = ManagedProcess(
        "redis",
        _spawn("redis", argv, workdir / "redis.log"),
        f"redis://127.0.0.1:{port}/0",
        workdir / "redis.log",
        workdir,
    )
    return _started(proc, port, timeout)


def neo4j_classpath() -> str:
    target = NEO4J_PROJECT / "target"
    if not (target / "classes").is_dir() or not (target / "lib").is_dir():
        raise LocalRuntimeError(
            f"Neo4j jars are not built in {target}: run `make deps` (Maven resolves Neo4j 5.26)"
        )
    return f"{target / 'classes'}{os.pathsep}{target / 'lib' / '*'}"


def start_neo4j(
    workdir: Path,
    port: int | None = None,
    heap_mb: int = 1024,
    page_cache_mb: int = 256,
    timeout: float = 120.0,
) -> ManagedProcess:
    """Start Neo4j 5.26 community with Bolt on loopback, data under `workdir`."""
    java = shutil.which("java")
    if java is None:
        raise LocalRuntimeError("java (JDK 17) is not installed")
    port = port or free_port()
    workdir.mkdir(parents=True, exist_ok=True)
    argv = [
        java,
        f"-Xmx{heap_mb}m",
        "-XX:+UseParallelGC",
        "-cp",
        neo4j_classpath(),
        "pml.local.Neo4jServer",
        str(workdir / "data"),
        str(port),
        str(page_cache_mb),
    ]
    proc = ManagedProcess(
        "neo4j",
        _spawn("neo4j", argv, workdir / "neo4j.log"),
        f"bolt://127.0.0.1:{port}",
        workdir / "neo4j.log",
        workdir,
    )
    return _started(proc, port, timeout)


def restart(proc: ManagedProcess) -> ManagedProcess:
    """Start the same server again on the same port and data folder (for drills)."""
    port = int(proc.url.rsplit(":", 1)[1].split("/")[0])
    assert proc.workdir is not None
    proc.stop()
    if proc.name == "redis":
        return start_redis(proc.workdir, port)
    return start_neo4j(proc.workdir, port)
