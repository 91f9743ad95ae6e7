"""CosineBatches: concurrent callers share one pass in a worker thread, each gets its own
cosines finished in a worker thread, and a failing or cancelled caller leaves the others
whole."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable

import numpy as np
import pytest

from pml_common.first_stage import part_cosines
from pml_search import cosine_batches
from pml_search.cosine_batches import CosineBatches

RNG = np.random.default_rng(0)
ROWS = [RNG.normal(size=(50, 4)).astype(np.float32), RNG.normal(size=(50, 3)).astype(np.float32)]


def _held(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, list[int]]:
    """Passes wait for the returned event; the list gets each pass's number of queries."""
    release, sizes = threading.Event(), []

    def held_pass(models: list[np.ndarray], queries: np.ndarray) -> np.ndarray:
        sizes.append(len(queries))
        release.wait(timeout=10)
        return part_cosines(models, queries)

    monkeypatch.setattr(cosine_batches, "part_cosines", held_pass)
    return release, sizes


def _cosines(batches: CosineBatches, queries: np.ndarray) -> Awaitable[np.ndarray]:
    return batches.finished(queries, lambda cosines: cosines)


async def _until(condition: object, what: str) -> None:
    for _ in range(500):
        if callable(condition) and condition():
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"never: {what}")


async def test_callers_arriving_during_a_pass_share_the_next_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release, sizes = _held(monkeypatch)
    batches = CosineBatches(lambda: ROWS)
    queries = [RNG.normal(size=(n, 7)).astype(np.float32) for n in (1, 2, 1, 3)]
    first = asyncio.create_task(_cosines(batches, queries[0]))
    await _until(lambda: batches.reading, "the first pass started")
    later = [asyncio.create_task(_cosines(batches, q)) for q in queries[1:]]
    await asyncio.sleep(0.05)
    release.set()
    results = await asyncio.gather(first, *later)
    assert sizes == [1, 6]  # the three callers that came during the first pass: one pass
    for query, result in zip(queries, results, strict=True):
        np.testing.assert_allclose(result, part_cosines(ROWS, query), rtol=1e-5, atol=1e-5)
    assert not batches.reading


async def test_a_cancelled_caller_leaves_the_others_their_answer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release, _ = _held(monkeypatch)
    batches = CosineBatches(lambda: ROWS)
    query = RNG.normal(size=(1, 7)).astype(np.float32)
    gone = asyncio.create_task(_cosines(batches, query))
    kept = asyncio.create_task(_cosines(batches, query))
    await _until(lambda: batches.reading, "the pass started")
    gone.cancel()
    release.set()
    np.testing.assert_allclose(await kept, part_cosines(ROWS, query), rtol=1e-5, atol=1e-5)
    assert gone.cancelled()


async def test_a_failing_pass_fails_its_callers_only() -> None:
    broken = [np.zeros((5, 9), np.float32)]  # wider than the queries: the product fails
    snapshots = iter([broken, ROWS])
    batches = CosineBatches(lambda: next(snapshots))
    query = RNG.normal(size=(1, 7)).astype(np.float32)
    with pytest.raises(ValueError):
        await _cosines(batches, query)
    np.testing.assert_allclose(
        await _cosines(batches, query), part_cosines(ROWS, query), rtol=1e-5, atol=1e-5
    )


async def test_each_caller_finishes_its_own_cosines_in_the_worker_thread(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release, sizes = _held(monkeypatch)
    batches = CosineBatches(lambda: ROWS)
    loop_thread = threading.get_ident()
    threads: list[int] = []

    def best_row(cosines: np.ndarray) -> int:
        threads.append(threading.get_ident())
        return int(np.argmax(cosines.mean(axis=0)[0]))

    def broken(cosines: np.ndarray) -> int:
        raise KeyError("this caller's own")

    queries = [RNG.normal(size=(1, 7)).astype(np.float32) for _ in range(3)]
    first = asyncio.create_task(batches.finished(queries[0], best_row))
    await _until(lambda: batches.reading, "the first pass started")
    failing = asyncio.create_task(batches.finished(queries[1], broken))
    last = asyncio.create_task(batches.finished(queries[2], best_row))
    await asyncio.sleep(0.05)
    release.set()
    with pytest.raises(KeyError, match="this caller's own"):
        await failing
    for query, task in ((queries[0], first), (queries[2], last)):
        assert await task == int(np.argmax(part_cosines(ROWS, query).mean(axis=0)[0]))
    assert sizes == [1, 2]  # the failing caller shared the second pass with the last one
    assert threads and loop_thread not in threads


async def test_the_next_pass_runs_while_the_last_callers_are_finishing() -> None:
    batches = CosineBatches(lambda: ROWS)
    finishing, release = threading.Event(), threading.Event()

    def slow(cosines: np.ndarray) -> np.ndarray:
        finishing.set()
        release.wait(timeout=10)
        return cosines

    query = RNG.normal(size=(1, 7)).astype(np.float32)
    first = asyncio.create_task(batches.finished(query, slow))
    await _until(finishing.is_set, "the first caller is finishing")
    try:  # the second caller's pass and finishing do not wait for the first's
        second = await asyncio.wait_for(_cosines(batches, query), timeout=5)
    finally:
        release.set()
    np.testing.assert_allclose(second, part_cosines(ROWS, query), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(await first, second)
