"""`pml bench cli`: wall time of `pml --help` and `pml search` as a user runs them.

Each command is a fresh process of the installed `pml` script (interpreter start, imports,
the call and the printing), run `runs` times after one unmeasured warm-up that fills the OS
file cache; the median and the slowest run are reported, and the median CPU time (user +
system) of the process, which other work on a busy machine inflates much less than the wall
time. `pml search` needs a running search service (`make run`); without one its row says so
instead of timing an error.
"""

from __future__ import annotations

import resource
import statistics
import subprocess
import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)

QUERY = "read a file"


def pml_command() -> list[str]:
    """`pml` as the installed script runs it: this interpreter, the CLI's module."""
    return [sys.executable, "-m", "pml_cli"]


def _cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _times(
    argv: list[str], runs: int, progress: Progress, task: TaskID
) -> tuple[list[float], list[float]] | None:
    """Wall and CPU seconds per run, or None when the command fails (nothing to time)."""
    wall, cpu = [], []
    for _ in range(runs + 1):
        cpu_before = _cpu_of_children()
        started = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, check=False)
        wall.append(time.perf_counter() - started)
        cpu.append(_cpu_of_children() - cpu_before)
        if done.returncode != 0:
            return None
        progress.advance(task)
    return wall[1:], cpu[1:]  # the first run only warms the file cache


def bench_cli(runs: int, console: Console) -> dict[str, Any]:
    pml = pml_command()
    commands = {"help": [*pml, "--help"], "search": [*pml, "search", QUERY]}
    result: dict[str, Any] = {"runs": runs}
    for name, argv in commands.items():
        # as pml_cli.phases.counted_phase shows a phase, without importing it: this
        # file also runs alone on an older checkout
        what = f"pml {' '.join(argv[3:])}: 1 warm-up run, then {runs} measured"
        console.print(what, markup=False, highlight=False, soft_wrap=True)
        columns = (
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
        )
        with Progress(*columns, console=console, transient=True) as progress:
            times = _times(argv, runs, progress, progress.add_task(what, total=runs + 1))
        if times is None:
            result[f"{name}_error"] = f"`{' '.join(argv[3:])}` failed (is `make run` running?)"
        else:
            wall, cpu = times
            result[f"{name}_median_s"] = round(statistics.median(wall), 3)
            result[f"{name}_max_s"] = round(max(wall), 3)
            result[f"{name}_cpu_median_s"] = round(statistics.median(cpu), 3)
    return result


if __name__ == "__main__":  # lets the same measurement run on an older checkout
    import json

    sys.stdout.write(json.dumps(bench_cli(int(sys.argv[1]), Console(stderr=True))) + "\n")
