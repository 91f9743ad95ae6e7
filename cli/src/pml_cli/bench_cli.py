"""`pml bench cli`: wall time of `pml --help` and `pml search` as a user runs them.

Each command is a fresh process of the installed `pml` script (interpreter start, imports,
the call and the printing), run `runs` times after one unmeasured warm-up that fills the OS
file cache; the median and the slowest run are reported. `pml search` needs a running search
service (`make run`); without one its row says so instead of timing an error.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import time
from typing import Any

from rich.console import Console
from rich.progress import Progress

QUERY = "read a file"


def pml_command() -> list[str]:
    """`pml` as the installed script runs it: this interpreter, the CLI's module."""
    return [sys.executable, "-m", "pml_cli"]


def _wall_times(argv: list[str], runs: int) -> list[float] | None:
    """Seconds per run, or None when the command fails (nothing to time)."""
    times = []
    for _ in range(runs + 1):
        started = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, check=False)
        times.append(time.perf_counter() - started)
        if done.returncode != 0:
            return None
    return times[1:]  # the first run only warms the file cache


def bench_cli(runs: int, console: Console) -> dict[str, Any]:
    pml = pml_command()
    commands = {"help": [*pml, "--help"], "search": [*pml, "search", QUERY]}
    result: dict[str, Any] = {"runs": runs}
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("timing the CLI", total=len(commands))
        for name, argv in commands.items():
            times = _wall_times(argv, runs)
            if times is None:
                result[f"{name}_error"] = f"`{' '.join(argv[3:])}` failed (is `make run` running?)"
            else:
                result[f"{name}_median_s"] = round(statistics.median(times), 3)
                result[f"{name}_max_s"] = round(max(times), 3)
            progress.advance(task)
    return result


if __name__ == "__main__":  # lets the same measurement run on an older checkout
    import json

    sys.stdout.write(json.dumps(bench_cli(int(sys.argv[1]), Console(stderr=True))) + "\n")
