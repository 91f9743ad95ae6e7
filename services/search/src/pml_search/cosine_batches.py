"""The dense pass of concurrent requests over one matrix, shared and run off the event loop.

At 10,000 tools × (512 + 384) dimensions (USE and e5; the default's MiniLM adds 384 more) a
request's dense pass reads 36 MB of vectors: it is bound by reading them, not by the arithmetic
(on the 2-core development machine one query takes 3.8 ms of a core, eight query columns at
once 8.8 ms). So the requests that arrive while a pass
runs wait for the next one and share it, one product per model for all of them, and the pass
runs in a worker thread (numpy releases the GIL) while the event loop goes on serving.

Each caller also hands the pass what to make of its cosines (`finish`: BM25, fusion, the top
k). The callers' finishing runs in another worker thread while the next pass already reads the
rows: under load the event loop's one thread, which parses, answers and traces every request,
bounds the throughput, and that work is numpy on whole rows. See docs/benchmarks.md, "Search
latency at 10k tools".
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from pml_common.first_stage import part_cosines

#: The rows a pass reads: each model's columns of the matrix's first n rows.
Snapshot = Callable[[], Sequence[np.ndarray]]

T = TypeVar("T")


@dataclass(eq=False)
class _Caller(Generic[T]):
    """One caller of a pass: its queries, what it makes of their cosines, its answer."""

    queries: np.ndarray
    finish: Callable[[np.ndarray], T]
    future: asyncio.Future[T]


class CosineBatches:
    """Cosines of query vectors with a matrix's rows, the queries of concurrent callers joined
    into one pass. Callers and the snapshot run on the event loop thread."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot
        self._waiting: list[_Caller[Any]] = []
        self._runner: asyncio.Task[None] | None = None
        self._finishing: set[asyncio.Task[None]] = set()
        #: True while a pass reads the rows in the worker thread: a writer must not change
        #: them in place then (`TenantMatrix.upsert` copies them first).
        self.reading = False

    async def finished(self, queries: np.ndarray, finish: Callable[[np.ndarray], T]) -> T:
        """`finish` of the (models, m, n) cosines of the `m` queries with the rows the pass
        read (n of them, at least those there when this was called), run in a worker thread:
        it must only read what it is given and what no writer changes in place. What it
        raises is raised here, to this caller only."""
        future: asyncio.Future[T] = asyncio.get_running_loop().create_future()
        self._waiting.append(_Caller(np.asarray(queries, dtype=np.float32), finish, future))
        if self._runner is None:
            self._runner = asyncio.create_task(self._run())
        return await future

    async def _run(self) -> None:
        try:
            # No pause for callers on their way between passes: measured side by side, a
            # 2 ms one cost a fifth of the throughput (docs/benchmarks.md).
            while self._waiting:
                batch, self._waiting = self._waiting, []
                await self._pass(batch)
        finally:
            self._runner = None
            # Left only when the runner itself was cancelled (the loop is closing).
            for caller in self._waiting:
                caller.future.cancel()
            self._waiting = []

    async def _pass(self, batch: list[_Caller[Any]]) -> None:
        live = [caller for caller in batch if not caller.future.done()]
        if not live:
            return
        models = self._snapshot()
        joined = np.concatenate([caller.queries for caller in live])
        self.reading = True
        try:
            cosines = await asyncio.to_thread(part_cosines, models, joined)
        except asyncio.CancelledError:  # the runner, as the loop closes
            for caller in live:
                caller.future.cancel()
            raise
        except Exception as exc:  # every caller of the pass gets the error; later ones go on
            _deliver(live, [(False, exc)] * len(live))
            return
        finally:
            self.reading = False
        # The callers' finishing runs in another thread while the next pass reads the rows.
        task = asyncio.create_task(self._finish(live, cosines))
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    async def _finish(self, live: list[_Caller[Any]], cosines: np.ndarray) -> None:
        try:
            outcomes = await asyncio.to_thread(_finished, live, cosines)
        except BaseException:  # the loop closing, or its executor shut down: none waits on
            for caller in live:
                caller.future.cancel()
            raise
        _deliver(live, outcomes)


def _deliver(callers: Sequence[_Caller[Any]], outcomes: Sequence[tuple[bool, Any]]) -> None:
    """Each caller still waiting gets its outcome: (True, result) or (False, exception)."""
    for caller, (ok, value) in zip(callers, outcomes, strict=True):
        if caller.future.done():
            continue
        if ok:
            caller.future.set_result(value)
        else:
            caller.future.set_exception(value)


def _finished(callers: Sequence[_Caller[Any]], cosines: np.ndarray) -> list[tuple[bool, Any]]:
    """In a worker thread: each caller's `finish` of its own columns of the pass's cosines,
    as (True, result) or (False, the exception it raised)."""
    outcomes: list[tuple[bool, Any]] = []
    start = 0
    for caller in callers:
        mine = cosines[:, start : start + len(caller.queries)]
        start += len(caller.queries)
        try:
            outcomes.append((True, caller.finish(mine)))
        except Exception as exc:  # this caller's only
            outcomes.append((False, exc))
    return outcomes
