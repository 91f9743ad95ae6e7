"""What `pml run` has started, on disk, so the next run finds a run that did not stop.

`pml run` writes `<state>/run.json` as soon as each process exists: its own pid and the pid of
every child, each with the process's start time (so a pid reused since by an unrelated program
is never taken for ours). The next `pml run` on the same state folder reads it:

- the run that wrote it is still alive: PML is already running here, say so and where;
- it is gone but some of its children are not (its children die with it through
  PR_SET_PDEATHSIG where `setpriv` exists; not elsewhere): stop them and say so;
- nothing of it is left: carry on.

Linux only (`/proc`); elsewhere the record is written and nothing is found alive.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel, ValidationError

RECORD = "run.json"


class RecordedProcess(BaseModel):
    name: str
    pid: int
    started: int  # start time in clock ticks since boot (/proc/<pid>/stat, field 22)
    url: str = ""


class RunFile(BaseModel):
    owner: RecordedProcess
    children: list[RecordedProcess] = []


def start_ticks(pid: int) -> int | None:
    """When process `pid` started (ticks since boot), or None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: split after its last ')'.
    fields = stat[stat.rindex(")") + 2 :].split()
    return int(fields[19])


def alive(proc: RecordedProcess) -> bool:
    """`proc` still runs (the same process, not a later one given the same pid)."""
    return start_ticks(proc.pid) == proc.started


@dataclass
class Leftovers:
    """What a previous run left: its owner if still running, and the children still alive."""

    owner: RecordedProcess | None
    children: list[RecordedProcess]


class RunRecord:
    def __init__(self, state_dir: Path) -> None:
        self.path = state_dir / RECORD
        self._run: RunFile | None = None

    def previous(self) -> Leftovers:
        """What the previous run on this state folder left running (nothing if none)."""
        try:
            run = RunFile.model_validate_json(self.path.read_text())
        except (OSError, ValidationError, ValueError):
            return Leftovers(None, [])
        owner = run.owner if alive(run.owner) else None
        return Leftovers(owner, [c for c in run.children if alive(c)])

    def begin(self) -> None:
        """Record this process as the owner of the run."""
        me = RecordedProcess(name="pml run", pid=os.getpid(), started=start_ticks(os.getpid()) or 0)
        self._run = RunFile(owner=me)
        self._write()

    def add(self, name: str, pid: int, url: str) -> None:
        if self._run is None:
            return
        started = start_ticks(pid)
        if started is None:  # already gone: nothing to find later
            return
        self._run.children.append(RecordedProcess(name=name, pid=pid, started=started, url=url))
        self._write()

    def end(self) -> None:
        """Everything stopped: nothing for the next run to find."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._run = None

    def _write(self) -> None:
        assert self._run is not None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self._run.model_dump(), indent=1))
        tmp.replace(self.path)  # atomic: a reader never sees half a record


def stop_leftovers(children: list[RecordedProcess], timeout: float = 20.0) -> None:
    """Stop processes a dead run left behind: SIGTERM to their groups (each child leads its
    own), SIGKILL to those still running after `timeout` seconds."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for child in children:
            if alive(child):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(child.pid, sig)
        deadline = time.monotonic() + timeout
        while any(alive(c) for c in children) and time.monotonic() < deadline:
            time.sleep(0.1)
