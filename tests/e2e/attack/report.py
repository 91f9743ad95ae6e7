"""What the suite prints: how many cases each property ran (at the end of the session, through
`conftest`), and short names for the fixtures a failing example lists."""

from __future__ import annotations

from collections import Counter
from typing import Any


class Tally:
    """Cases each property ran, by outcome (a gRPC status, or what the bus did with an entry)."""

    def __init__(self) -> None:
        self.cases: dict[str, Counter[str]] = {}

    def add(self, prop: str, outcome: str) -> None:
        self.cases.setdefault(prop, Counter())[outcome] += 1

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text("Tally")


class Terse:
    """A fixture shown by its class name in a failing example, where hypothesis would print
    every field (the whole settings, the victim's serialised replies)."""

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(type(self).__name__)
