"""What a long CLI command (a `pml bench`, a private system started for `pml eval`) shows on
its console while it works, phase by phase.

Each phase starts with a line that stays: a log file or CI output, where rich draws no live
display, has it too. While the phase runs, a terminal also shows a spinner, or a bar when the
phase counts its work, cleared once it ends. Stdout is left to the command's result.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.status import Status


def step(console: Console, what: str) -> None:
    """The line that opens a phase (one whose own spinners or bars are shown by its callee)."""
    console.print(what, markup=False, highlight=False, soft_wrap=True)


@contextmanager
def phase(console: Console, what: str) -> Iterator[Status]:
    """A phase whose length is unknown: its line, then a spinner while it runs."""
    step(console, what)
    with console.status(f"{what}…") as status:
        yield status


@dataclass(frozen=True)
class Bar:
    """The bar of a counted phase."""

    progress: Progress
    task: TaskID

    def advance(self, count: int = 1) -> None:
        self.progress.advance(self.task, count)

    def reach(self, completed: int) -> None:
        self.progress.update(self.task, completed=completed)


@contextmanager
def counted_phase(console: Console, what: str, total: int) -> Iterator[Bar]:
    """A phase of `total` units of work: its line, then a bar (done / total, time spent)."""
    step(console, what)
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
    )
    with progress:
        yield Bar(progress, progress.add_task(what, total=total))
