"""The dense pass of concurrent requests over one matrix, shared and run off the event loop.

At 10,000 tools × (512 + 384) dimensions a request's dense pass reads 36 MB of vectors: it is
bound by reading them, not by the arithmetic (on the 2-core development machine one query takes
3.8 ms of a core, eight query columns at once 8.8 ms). So the requests that arrive while a pass
runs wait for the next one and share it, one product per model for all of them, and the pass
runs in a worker thread (numpy releases the GIL) while the event loop goes on serving: parsing
requests, BM25, fusion. See docs/benchmarks.md, "Search latency at 10k tools".
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence

import numpy as np

from pml_common.first_stage import part_cosines

#: The rows a pass reads: each model's columns of the matrix's first n rows.
Snapshot = Callable[[], Sequence[np.ndarray]]


class CosineBatches:
    """Cosines of query vectors with a matrix's rows, the queries of concurrent callers joined
    into one pass. Callers and the snapshot run on the event loop thread."""

    def __init__(self, snapshot: Snapshot) -> None:
        self._snapshot = snapshot
        self._waiting: list[tuple[np.ndarray, asyncio.Future[np.ndarray]]] = []
        self._runner: asyncio.Task[None] | None = None
        #: True while a pass reads the rows in the worker thread: a writer must not change
        #: them in place then (`TenantMatrix.upsert` copies them first).
        self.reading = False

    async def cosines(self, queries: np.ndarray) -> np.ndarray:
        """(models, m, n) cosines of the `m` queries with the rows the pass read (n of them,
        at least those there when this was called)."""
        future: asyncio.Future[np.ndarray] = asyncio.get_running_loop().create_future()
        self._waiting.append((np.asarray(queries, dtype=np.float32), future))
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
            for _, future in self._waiting:
                future.cancel()
            self._waiting = []

    async def _pass(self, batch: list[tuple[np.ndarray, asyncio.Future[np.ndarray]]]) -> None:
        live = [(queries, future) for queries, future in batch if not future.done()]
        if not live:
            return
        models = self._snapshot()
        joined = np.concatenate([queries for queries, _ in live])
        self.reading = True
        try:
            cosines = await asyncio.to_thread(part_cosines, models, joined)
        except asyncio.CancelledError:  # the runner, as the loop closes
            for _, future in live:
                future.cancel()
            raise
        except Exception as exc:  # every caller of the pass gets the error; later ones go on
            for _, future in live:
                if not future.done():
                    future.set_exception(exc)
            return
        finally:
            self.reading = False
        start = 0
        for queries, future in live:
            if not future.done():
                future.set_result(cosines[:, start : start + len(queries)])
            start += len(queries)
