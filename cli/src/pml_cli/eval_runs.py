"""What the tool and plan evaluations share: query fitting, per-group figures, failures,
the per-query log and the comparison of every method with the best supervised baseline.

- A query longer than the service accepts (`Settings.max_query_chars`) is cut to that length
  before any method sees it (`fit_query`), and the result counts them (`truncated`): every
  method answers the same text, and a long query stays in the evaluation instead of failing.
- A query whose call fails is reported (`failed`, and the first messages in `errors`) and
  scored as an empty answer, so every method is averaged over the same queries and a failing
  method cannot look better by dropping its hard queries.
- Query ids with a level prefix (the part before the last `-`: `etom-L1-0001` → `etom-L1`,
  `multi-3` → `multi`) are also averaged per prefix (`by_group`).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, Generic, Protocol, TypeVar

import grpc

from pml_cli.eval_data import EvalError, ToolQuery

#: How much of a query the per-query log keeps.
LOGGED_QUERY_CHARS = 200
#: How many failure messages a result lists (the count covers all).
FIRST_ERRORS = 5


def fit_query(text: str, limit: int) -> str:
    """`text` cut to the service's query limit. The one place that truncates: when the
    service takes long intents itself, this is where the client stops cutting."""
    return text if len(text) <= limit else text[:limit]


def fit_queries(queries: Sequence[ToolQuery], limit: int) -> tuple[list[ToolQuery], int]:
    """The queries with their text fitted to `limit`, and how many were cut."""
    fitted = [q.model_copy(update={"query": fit_query(q.query, limit)}) for q in queries]
    return fitted, sum(1 for q in queries if len(q.query) > limit)


def check_unique_ids(queries: Sequence[ToolQuery]) -> None:
    """Per-query outputs and baselines key on the id, so two queries may not share one."""
    seen: set[str] = set()
    for q in queries:
        if q.id in seen:
            raise EvalError(f"query id {q.id!r} is used twice; ids must be unique")
        seen.add(q.id)


def group_of(query_id: str) -> str | None:
    """The level prefix of a query id (before its last `-`), None without one."""
    prefix, dash, _ = query_id.rpartition("-")
    return prefix if dash and prefix else None


class Figures(Protocol):
    def result(self) -> dict[str, float | int]: ...


M = TypeVar("M", bound=Figures)
T = TypeVar("T")


class Grouped(Generic[M]):
    """One running-mean object overall and one per level prefix of the query ids."""

    def __init__(self, factory: Callable[[], M]) -> None:
        self._factory = factory
        self.overall = factory()
        self.groups: dict[str, M] = {}

    def of(self, query_id: str) -> list[M]:
        """The objects a query's figures go into: overall, and its group's when it has one."""
        group = group_of(query_id)
        if group is None:
            return [self.overall]
        return [self.overall, self.groups.setdefault(group, self._factory())]

    def result(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.overall.result())
        if self.groups:
            out["by_group"] = {g: self.groups[g].result() for g in sorted(self.groups)}
        return out


@dataclass
class Failures:
    count: int = 0
    messages: list[str] = field(default_factory=list)

    def add(self, query_id: str, message: str) -> None:
        self.count += 1
        if len(self.messages) < FIRST_ERRORS:
            self.messages.append(f"{query_id}: {message}")

    def result(self) -> dict[str, Any]:
        return {"failed": self.count, "errors": self.messages}


def retry_unavailable(call: Callable[[], T]) -> T:
    """`call()`, once more on UNAVAILABLE: a blip on a shared machine, or a server closing an
    old connection (its maximum connection age) under a long call, must not void a long run."""
    try:
        return call()
    except grpc.RpcError as exc:
        if exc.code() != grpc.StatusCode.UNAVAILABLE:
            raise
        return call()


def describe(exc: grpc.RpcError) -> str:
    code = exc.code()
    return f"{code.name}: {exc.details()}"


class PerQueryLog:
    """JSONL, one line per (method, query); does nothing without a file."""

    def __init__(self, stream: IO[str] | None) -> None:
        self._stream = stream

    def write(self, method: str, query: ToolQuery, fold: int | None, **fields: Any) -> None:
        if self._stream is None:
            return
        record = {
            "method": method,
            "id": query.id,
            "query": query.query[:LOGGED_QUERY_CHARS],
            "fold": fold,
            **fields,
        }
        self._stream.write(json.dumps(record) + "\n")


@contextmanager
def per_query_log(path: Path | None) -> Iterator[PerQueryLog]:
    if path is None:
        yield PerQueryLog(None)
        return
    try:
        # Line-buffered: a run stopped half-way still leaves every answer it got.
        stream = path.open("w", encoding="utf-8", buffering=1)
    except OSError as exc:
        raise EvalError(f"{path}: cannot write: {exc.strerror}") from exc
    with stream:
        yield PerQueryLog(stream)


def methods_of(spec: str, allowed: Sequence[str], context: str = "") -> list[str]:
    """`a` or `a,b,...`: known methods, in the given order, without repeats."""
    methods = list(dict.fromkeys(m.strip() for m in spec.split(",") if m.strip()))
    unknown = [m for m in methods if m not in allowed]
    if unknown or not methods:
        where = f" {context}" if context else ""
        raise EvalError(
            f"unknown method {spec!r}{where}; choose among {', '.join(allowed)} (comma-separated)"
        )
    return methods


def compare_to_baselines(
    results: Mapping[str, dict[str, Any]], baselines: Sequence[str], metrics: Sequence[str]
) -> None:
    """Add to every other method `vs_best_baseline` (its figure minus the best baseline's, per
    metric) and `best_baseline` (which baseline that was), when any baseline ran."""
    ran = [b for b in baselines if b in results]
    if not ran:
        return
    best = {m: max(ran, key=lambda b: float(results[b][m])) for m in metrics}
    for name, result in results.items():
        if name in ran:
            continue
        result["vs_best_baseline"] = {
            m: round(float(result[m]) - float(results[best[m]][m]), 4) for m in metrics
        }
        result["best_baseline"] = best
