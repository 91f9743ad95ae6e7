"""The dense pass of concurrent requests over one matrix, shared and run off the event loop.

At 10,000 tools × 1,280 dimensions (the default tool embedder's three models) a request's dense
pass reads every row's 8-bit codes, 13 MB (`pml_search.quantised_pass`): it is bound by reading
them, not by the arithmetic. So the requests that arrive while a pass runs wait for the next one
and share it, one product per model for all of them, and the pass runs in a worker thread
(onnxruntime and numpy release the GIL) while the event loop goes on serving.

Each caller also hands the pass what to make of its cosines (`finish`: BM25, fusion, the top k,
the float32 re-scoring of the rows that can reach it). The callers' finishing runs in another
worker thread while the next pass already reads the rows: under load the event loop's one
thread, which parses, answers and traces every request, bounds the throughput, and that work is
numpy on whole rows. See docs/benchmarks.md, "Search latency at 10k tools".
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import numpy as np

from pml_search.quantised_pass import Approximate, IntegerProduct, Rows, approximate

#: The rows a pass reads: each model's columns of the matrix's first n rows, and their codes.
Snapshot = Callable[[], Rows]

T = TypeVar("T")


@dataclass(eq=False)
class _Caller(Generic[T]):
    """One caller of a pass: its queries, what it makes of their cosines, its answer."""

    queries: np.ndarray
    finish: Callable[[Approximate], T]
    future: asyncio.Future[T]


class CosineBatches:
    """Cosines of query vectors with a matrix's rows, the queries of concurrent callers joined
    into one pass. Callers and the snapshot run on the event loop thread."""

    def __init__(self, snapshot: Snapshot, product: IntegerProduct) -> None:
        self._snapshot = snapshot
        self._product = product
        self._waiting: list[_Caller[Any]] = []
        self._runner: asyncio.Task[None] | None = None
        self._finishing: set[asyncio.Task[None]] = set()
        # Passes and finishings reading the rows in worker threads (a finishing re-scores rows).
        self._readers = 0

    @property
    def reading(self) -> bool:
        """True while a pass or its callers' finishing reads the rows in a worker thread: a
        writer must not change them in place then (`TenantMatrix.upsert` copies them first)."""
        return self._readers > 0

    async def finished(self, queries: np.ndarray, finish: Callable[[Approximate], T]) -> T:
        """`finish` of the approximate cosines of the `m` queries with the rows the pass read
        (n of them, at least those there when this was called; `Approximate.exact` re-scores
        them), run in a worker thread: it must only read what it is given and what no writer
        changes in place. What it raises is raised here, to this caller only."""
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
        rows = self._snapshot()
        joined = np.concatenate([caller.queries for caller in live])
        self._readers += 1
        try:
            cosines = await asyncio.to_thread(approximate, rows, joined, self._product)
        except asyncio.CancelledError:  # the runner, as the loop closes
            self._readers -= 1
            for caller in live:
                caller.future.cancel()
            raise
        except Exception as exc:  # every caller of the pass gets the error; later ones go on
            self._readers -= 1
            _deliver(live, [(False, exc)] * len(live))
            return
        # The callers' finishing runs in another thread while the next pass reads the rows;
        # it holds the pass's reading until it is done.
        task = asyncio.create_task(self._finish(live, cosines))
        self._finishing.add(task)
        task.add_done_callback(self._finishing.discard)

    async def _finish(self, live: list[_Caller[Any]], cosines: Approximate) -> None:
        try:
            outcomes = await asyncio.to_thread(_finished, live, cosines)
        except BaseException:  # the loop closing, or its executor shut down: none waits on
            for caller in live:
                caller.future.cancel()
            raise
        finally:
            self._readers -= 1
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


def _finished(callers: Sequence[_Caller[Any]], cosines: Approximate) -> list[tuple[bool, Any]]:
    """In a worker thread: each caller's `finish` of its own columns of the pass's cosines,
    as (True, result) or (False, the exception it raised)."""
    outcomes: list[tuple[bool, Any]] = []
    start = 0
    for caller in callers:
        mine = cosines.columns(start, start + len(caller.queries))
        start += len(caller.queries)
        try:
            outcomes.append((True, caller.finish(mine)))
        except Exception as exc:  # this caller's only
            outcomes.append((False, exc))
    return outcomes
