"""`pml run`'s record of what it started: a later run finds a run still going, and stops what
a killed run left behind (real processes, each in its own session as `pml run` starts them)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from pml_cli.run_record import (
    RecordedProcess,
    RunFile,
    RunRecord,
    alive,
    start_ticks,
    stop_leftovers,
)


def _sleeper() -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(300)"], start_new_session=True
    )


def _recorded(name: str, proc: subprocess.Popen[bytes]) -> RecordedProcess:
    started = start_ticks(proc.pid)
    assert started is not None
    return RecordedProcess(name=name, pid=proc.pid, started=started)


def test_a_run_still_going_is_found(tmp_path: Path) -> None:
    record = RunRecord(tmp_path)
    assert record.previous().owner is None  # no record yet
    record.begin()
    found = RunRecord(tmp_path).previous()
    assert found.owner is not None and found.owner.pid == os.getpid()
    record.end()
    assert RunRecord(tmp_path).previous().owner is None


def test_what_a_dead_run_left_is_found_and_stopped(tmp_path: Path) -> None:
    owner = subprocess.Popen([sys.executable, "-c", "pass"])
    owner_record = _recorded("pml run", owner)
    owner.wait()
    left = _sleeper()
    try:
        run = RunFile(owner=owner_record, children=[_recorded("redis", left)])
        (tmp_path / "run.json").write_text(run.model_dump_json())
        found = RunRecord(tmp_path).previous()
        assert found.owner is None
        assert [c.pid for c in found.children] == [left.pid]
        stop_leftovers(found.children)
        assert left.wait(10) is not None
        assert not alive(found.children[0])
    finally:
        left.kill()


def test_a_reused_pid_is_not_taken_for_a_recorded_process(tmp_path: Path) -> None:
    me = RecordedProcess(name="x", pid=os.getpid(), started=(start_ticks(os.getpid()) or 0) + 1)
    assert not alive(me)
