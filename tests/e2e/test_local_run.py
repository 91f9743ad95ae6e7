"""`make run` as a newcomer runs it in a terminal, and stops it with Ctrl-C.

Each test starts `make run` in its own session, so its process group plays the terminal's
foreground group (make, uv, `pml run`), on free ports and a private state folder. Every process
the run starts carries a marker in its environment, which is how the tests find what is left:
after an interrupt (the whole group, once or twice) or a SIGKILL of `pml run` itself, nothing
with the marker may remain and every port must be free. The commands the run prints are run as
printed, by a shell with a new login's PATH (no uv on it).

`make -o deps run`: the suite's environment is installed already; reinstalling it here while
other tests use it is not what these tests are about.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from pml_common.local_runtime import REPO_ROOT, free_port, port_open
from pml_common.testing import until

MARKER = "PML_TEST_LOCAL_RUN"
#: A new login shell's PATH on Debian/Ubuntu (/etc/login.defs), without ~/.local/bin.
NEW_SHELL_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
START_S = 420.0
STOP_S = 120.0
SERVICES = ("SEARCH", "SCORER", "PLANNER", "INGEST", "TRAINER")


@dataclass
class Run:
    make: subprocess.Popen[bytes]
    marker: str
    state: Path
    output: Path
    ports: dict[str, int]
    env: dict[str, str]

    def text(self) -> str:
        return self.output.read_text(errors="replace")


def system_pids(marker: str) -> list[int]:
    """Every live process whose environment carries `marker`: make, uv, pml and all it began."""
    needle = f"{MARKER}={marker}".encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            environ = (entry / "environ").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and needle in environ.split(b"\0"):
            found.append(int(entry.name))
    return found


def _env(state: Path, marker: str, ports: dict[str, int]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PML_")}
    env.update(
        {
            MARKER: marker,
            "PML_RUN_STATE_DIR": str(state),
            "PML_REDIS_URL": f"redis://127.0.0.1:{ports['REDIS']}/0",
            "PML_NEO4J_URI": f"bolt://127.0.0.1:{ports['NEO4J']}",
        }
    )
    for name in SERVICES:
        env[f"PML_{name}_PORT"] = str(ports[name])
        if name != "TRAINER":
            env[f"PML_{name}_ADDR"] = f"127.0.0.1:{ports[name]}"
    return env


def _distinct_free_ports(names: tuple[str, ...]) -> dict[str, int]:
    """A free port per name, no two alike (two free_port calls can return the same port)."""
    chosen: dict[str, int] = {}
    while len(chosen) < len(names):
        port = free_port()
        if port not in chosen.values():
            chosen[names[len(chosen)]] = port
    return chosen


@contextlib.contextmanager
def make_run(tmp_path: Path, ports: dict[str, int] | None = None) -> Iterator[Run]:
    """`make run` started (on free ports unless given), until it says PML is running;
    whatever happens, nothing of it is left afterwards (SIGKILL to what remains)."""
    marker = uuid.uuid4().hex
    ports = ports or _distinct_free_ports(("REDIS", "NEO4J", *SERVICES))
    state = tmp_path / "state"
    output = tmp_path / "make-run.out"
    env = _env(state, marker, ports)
    with output.open("wb") as sink:
        make = subprocess.Popen(
            ["make", "--no-print-directory", "-o", "deps", "run"],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=sink,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    run = Run(make, marker, state, output, ports, env)
    try:
        until(
            lambda: "Ctrl-C stops everything" in run.text() or make.poll() is not None,
            START_S,
            "make run to start",
        )
        assert make.poll() is None, f"make run ended during start-up:\n{run.text()}"
        yield run
    finally:
        for pid in system_pids(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            make.wait(10)


def assert_all_gone(run: Run) -> None:
    until(lambda: not system_pids(run.marker), STOP_S, "every process of the run to end")
    # A killed process shows as a zombie once its main thread is gone, while the kernel may
    # still be ending its other threads and closing its sockets: the ports follow shortly.
    until(
        lambda: not any(port_open(p) for p in run.ports.values()), 30, "the run's ports to be free"
    )
    assert run.make.poll() is not None


def printed_commands(text: str) -> list[str]:
    block = text.split("Try, from this folder:", 1)[1].split("Ctrl-C stops everything", 1)[0]
    return [line.strip() for line in block.splitlines() if line.strip()]


@pytest.mark.timeout(START_S + 900)
def test_printed_commands_work_in_a_new_shell_and_one_ctrl_c_stops_all(tmp_path: Path) -> None:
    with make_run(tmp_path) as run:
        commands = printed_commands(run.text())
        assert any(" search " in c for c in commands), run.text()
        assert not any(c.startswith("uv ") for c in commands)
        shell_env = {"PATH": NEW_SHELL_PATH, "HOME": str(tmp_path), "LANG": "C.UTF-8"}
        for command in commands:
            done = subprocess.run(
                ["bash", "-c", command],
                cwd=REPO_ROOT,
                env=shell_env,
                capture_output=True,
                text=True,
                timeout=120,
            )
            assert done.returncode == 0, f"{command}\n{done.stdout}\n{done.stderr}"

        again = subprocess.run(
            [str(REPO_ROOT / ".venv" / "bin" / "pml"), "run"],
            cwd=REPO_ROOT,
            env=run.env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert again.returncode != 0
        assert "already running" in again.stderr, again.stderr

        os.killpg(run.make.pid, signal.SIGINT)
        assert_all_gone(run)
        assert "stopping" in run.text()
        assert not (run.state / "run.json").exists()


@pytest.mark.timeout(START_S + 300)
def test_two_ctrl_c_in_quick_succession_still_stop_all(tmp_path: Path) -> None:
    with make_run(tmp_path) as run:
        os.killpg(run.make.pid, signal.SIGINT)
        time.sleep(1.5)  # a second Ctrl-C, not the echo make and uv send of the first
        os.killpg(run.make.pid, signal.SIGINT)
        assert_all_gone(run)
        assert "killed" in run.text(), run.text()


@pytest.mark.timeout(2 * START_S + 600)
def test_children_die_with_a_killed_pml_run_and_the_next_run_starts(tmp_path: Path) -> None:
    with make_run(tmp_path) as run:
        owner = json.loads((run.state / "run.json").read_text())["owner"]["pid"]
        os.kill(owner, signal.SIGKILL)
        assert_all_gone(run)
    # The same state folder (the record of the killed run) and the same ports.
    with make_run(tmp_path, run.ports) as second:
        assert "already in use" not in second.text()
        os.killpg(second.make.pid, signal.SIGTERM)
        assert_all_gone(second)
